"""The console's queries: grouped counts, pages of rows and rejected deliveries, the
dashboard's figures and the audited payload view.

Raw identifiers are carried so that the caller can hash them; nothing here holds payload bytes.
A page is ordered by a key that never repeats (a row's ``seq``, a rejection's ``id``), so the
next page starts strictly after the last one seen: keyset pagination, never OFFSET.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bridge import sql
from bridge.store.console import OnCallReads
from bridge.types import Key, State, TargetClass


@dataclass(frozen=True, slots=True)
class GroupCount:
    """How many rows of one subscription, job type and tenant are in one state."""

    subscription: str
    job_type: str
    tenant_id: str
    state: State
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RowSummary:
    """One work row as a list shows it."""

    seq: int
    key: Key
    subscription: str
    job_type: str
    target_class: TargetClass
    state: State
    fence: int
    attempts: int
    max_attempts: int
    outcome_code: str | None
    created_at: datetime
    claimed_at: datetime | None
    settled_at: datetime | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedSummary:
    """One rejected delivery as a list shows it; the key is None when it could not be read."""

    id: int
    kind: str
    reason: str
    subscription: str
    key: Key | None
    created_at: datetime
    redriven_at: datetime | None
    redriven_by: str | None
    redrive_outcome: str | None
    resolved_at: datetime | None
    resolved_by: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FigurePoint:
    """The dashboard's figures at the end of one time bucket, read from the rows as they are
    now: a stalled claim since taken over counts as a takeover, no longer as stalled, and an
    unknown row since redriven no longer counts as unknown."""

    at: datetime
    #: claims still held whose lease had expired by ``at``
    stalled: int
    #: the age at ``at`` of the oldest row unknown by then (None: there was none)
    oldest_unknown_seconds: float | None
    #: rows quarantined and undecodable deliveries received in the bucket
    quarantined: int
    #: claims in the bucket that took over an expired lease
    takeovers: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadView:
    """One operation's payload bytes as a person asked to see them, and when the view was
    recorded in the audit."""

    key: Key
    body: bytes | None
    viewed_at: datetime


class ConsoleQueries(OnCallReads):
    """What the console reads (and the one payload view it audits); the on-call pages' reads
    are inherited from :class:`~bridge.store.console.OnCallReads`."""

    def group_counts(self) -> list[GroupCount]:
        """Counts by subscription, job type, tenant and state (the console's counts)."""
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_counts")).fetchall()
        return [GroupCount(sub, job, t, State(s), int(n)) for sub, job, t, s, n in rows]

    def rows_page(
        self,
        state: State,
        *,
        after: int = 0,
        limit: int = 50,
        subscription: str | None = None,
        job_type: str | None = None,
    ) -> list[RowSummary]:
        """Rows in ``state`` with a ``seq`` greater than ``after``, in ``seq`` order."""
        params = {
            "state": state.value,
            "after": after,
            "limit": limit,
            "subscription": subscription,
            "job_type": job_type,
        }
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_rows"), params).fetchall()
        return [_row_summary(r) for r in rows]

    def rejected_page(
        self, *, after: int = 0, limit: int = 50, kind: str | None = None, open_only: bool = False
    ) -> list[RejectedSummary]:
        """Rejected deliveries with an id greater than ``after``, in id order."""
        params = {"after": after, "limit": limit, "kind": kind, "open_only": open_only}
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_rejected"), params).fetchall()
        return [_rejected_summary(r) for r in rows]

    def figures(self, *, buckets: int, bucket: timedelta) -> list[FigurePoint]:
        """The dashboard's figures at the end of each of ``buckets`` buckets of ``bucket``
        up to now, oldest first."""
        params = {
            "now": self._db.now(),
            "buckets": buckets,
            "bucket_seconds": bucket.total_seconds(),
        }
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_figures"), params).fetchall()
        return [
            FigurePoint(
                at=at,
                stalled=int(stalled),
                oldest_unknown_seconds=float(oldest) if oldest is not None else None,
                quarantined=int(quarantined),
                takeovers=int(takeovers),
            )
            for at, stalled, oldest, quarantined, takeovers in rows
        ]

    def view_payload(self, key: Key, *, actor: str, reason: str) -> PayloadView | None:
        """One operation's payload bytes, audited in the same statement; None: no such row
        (and nothing audited)."""
        params = {
            "tenant_id": key.tenant_id,
            "operation_id": key.operation_id,
            "actor": actor,
            "reason": reason,
            "now": self._db.now(),
        }
        with self._db.connection("payload view") as conn:
            row = conn.execute(sql.statement("console_payload_view"), params).fetchone()
        if row is None:
            return None
        body, at = row
        return PayloadView(key=key, body=bytes(body) if body is not None else None, viewed_at=at)


def _row_summary(row: tuple[Any, ...]) -> RowSummary:
    (seq, tenant_id, operation_id, subscription, job_type, target_class, state, fence,
     attempts, max_attempts, outcome_code, created_at, claimed_at, settled_at, lease_expires_at,
    ) = row  # fmt: skip
    return RowSummary(
        seq=int(seq),
        key=Key(tenant_id, operation_id),
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        state=State(state),
        fence=int(fence),
        attempts=int(attempts),
        max_attempts=int(max_attempts),
        outcome_code=outcome_code,
        created_at=created_at,
        claimed_at=claimed_at,
        settled_at=settled_at,
        lease_expires_at=lease_expires_at,
    )


def _rejected_summary(row: tuple[Any, ...]) -> RejectedSummary:
    (rejected_id, kind, reason, subscription, tenant_id, operation_id, created_at, redriven_at,
     redriven_by, redrive_outcome, resolved_at, resolved_by,
    ) = row  # fmt: skip
    known = tenant_id is not None and operation_id is not None
    return RejectedSummary(
        id=int(rejected_id),
        kind=kind,
        reason=reason,
        subscription=subscription,
        key=Key(tenant_id, operation_id) if known else None,
        created_at=created_at,
        redriven_at=redriven_at,
        redriven_by=redriven_by,
        redrive_outcome=redrive_outcome,
        resolved_at=resolved_at,
        resolved_by=resolved_by,
    )
