"""Resolve: close rejected deliveries (conflicts, undecodable input) a person has dealt with;
the work rows are never touched. Each close is one guarded, audited statement."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.store.operator import OperatorQueries
from bridge.store.records import (
    RejectedStatus,
    ResolvedDelivery,
)


@dataclass(frozen=True, slots=True)
class RejectionFilter:
    """Which open rejected deliveries a resolve closes: named ids, or a filter (never all of
    them by accident: the command line asks for ids or at least one filter)."""

    ids: tuple[int, ...] | None = None
    kind: str | None = None
    subscription: str | None = None
    tenant_id: str | None = None
    operation_id: str | None = None
    limit: int = 100


@dataclass
class ResolveReport:
    dry_run: bool
    resolved: list[ResolvedDelivery] = field(default_factory=list)
    #: named ids that were not closed, each with why (already closed, or not in the database)
    not_open: list[tuple[int, str]] = field(default_factory=list)


def resolve(
    store: OperatorQueries,
    selection: RejectionFilter,
    *,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> ResolveReport:
    """Close rejected deliveries a person has dealt with (a conflict's producer told, a
    quarantined delivery given up on): acknowledged, with actor and reason on each delivery.

    The operation's work row is never touched: a conflict changes nothing, so closing it only
    stops it from awaiting a person. A quarantined delivery resolved is no longer redriven.
    """
    if not actor or not reason:
        raise ValueError("a resolve needs an actor and a reason for the audit record")
    report = ResolveReport(dry_run)
    report.resolved = store.resolve_rejected(
        actor=actor,
        reason=reason,
        ids=selection.ids,
        kind=selection.kind,
        subscription=selection.subscription,
        tenant_id=selection.tenant_id,
        operation_id=selection.operation_id,
        limit=selection.limit,
        dry_run=dry_run,
    )
    if selection.ids:
        done = {r.id for r in report.resolved}
        missing = [i for i in selection.ids if i not in done]
        known = {s.id: s for s in store.rejected_status(missing)} if missing else {}
        for i in missing:
            report.not_open.append((i, _why_not_open(known.get(i))))
    return report


def _why_not_open(status: RejectedStatus | None) -> str:
    if status is None:
        return "no such rejected delivery (never recorded, or purged or erased since)"
    if status.resolved_at is not None:
        return f"already resolved by {status.resolved_by} at {status.resolved_at.isoformat()}"
    if status.redriven_at is not None:
        return (
            f"already closed by a redrive ({status.redriven_by}, {status.redriven_at.isoformat()})"
        )
    return "does not match the other filters, or is locked by another resolve or redrive"
