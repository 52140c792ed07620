"""Lifting a target's rate limit wait: the rows it scheduled become due at once, each move
audited as a redrive is."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.store.operator import OperatorQueries
from bridge.store.records import (
    LiftedWait,
)

#: how a lift's audit entries are told from redrives: the reason ends with it
LIFTED_MARK = "[rate wait lifted]"


@dataclass
class LiftReport:
    """What lifting rate limit waits did (or, on a dry run, would do)."""

    dry_run: bool
    lifted: list[LiftedWait]

    @property
    def moved(self) -> int:
        """The rows the lifted waits had scheduled that became due at once."""
        return sum(w.moved for w in self.lifted)


def lift_rate_waits(
    store: OperatorQueries,
    job_type: str,
    *,
    tenant_id: str | None = None,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> LiftReport:
    """Lift the rate limit waits of a job type (of one tenant, or every tenant) that an
    operator knows to be over: the target's limit was raised, its ``Retry-After`` was wrong.

    The waits still ahead are deleted and the rows they had scheduled are due at once, each
    audited as a redrive is (``redrive_audit``: the actor, the reason marked
    :data:`LIFTED_MARK`, the row's fence and attempts; a ``rate_wait_lifted`` entry in its
    attempt history). Nothing else changes: a row keeps its attempts and its fence, and a
    target that still limits answers ``429`` again, which starts a new wait.
    """
    if not actor or not reason:
        raise ValueError("lifting a wait needs an actor and a reason for the audit record")
    lifted = store.lift_rate_waits(
        job_type,
        tenant_id,
        actor=actor,
        reason=f"{reason} {LIFTED_MARK}",
        dry_run=dry_run,
    )
    return LiftReport(dry_run, lifted)
