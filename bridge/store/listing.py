"""What the console's lists read: grouped counts and pages of rows and rejected deliveries.

Raw identifiers are carried so that the caller can hash them; nothing here holds payload bytes.
A page is ordered by a key that never repeats (a row's ``seq``, a rejection's ``id``), so the
next page starts strictly after the last one seen: keyset pagination, never OFFSET.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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
