"""What the operator commands read back from the store: histories, parked work, counts.

These are read models for people (``fencebridge inspect``, ``redrive``, ``purge``, ``erase``),
kept apart from the protocol's own types in :mod:`bridge.types`. None of them carries payload
bytes except :class:`ParkedRow` and :class:`QuarantinedDelivery`, which a redrive needs to
reconcile or re-decode; nothing here is ever printed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bridge.types import Key, State, TargetClass


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkRecord:
    """One work row as an operator sees it: its whole lifecycle, the payload by size only."""

    subscription: str
    job_type: str
    target_class: TargetClass
    schema_version: str | None
    state: State
    fence: int
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    next_attempt_at: datetime
    intent_fence: int | None
    outcome_code: str | None
    outcome_detail: str | None
    payload_hash: bytes
    broker_message_id: str | None
    receive_count: int | None
    ordering_key: str | None
    created_at: datetime
    claimed_at: datetime | None
    settled_at: datetime | None
    updated_at: datetime
    #: size of the stored payload; None once it is gone
    payload_bytes: int | None
    #: the producer's W3C traceparent, when the delivery carried one
    trace_context: str | None = None

    @property
    def trace_id(self) -> str | None:
        """The producer's trace id (from ``trace_context``), to find the trace by."""
        parts = (self.trace_context or "").split("-")
        return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RedriveRecord:
    """One audited redrive of an operation."""

    at: datetime
    actor: str
    reason: str
    from_state: str
    to_state: str
    fence: int
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One entry of an operation's attempt history: a claim under a fence (open while
    ``ended_at`` is None) or an operator's redrive. Codes and error classes only, never error
    text, which may quote a payload."""

    kind: str
    fence: int
    worker: str | None
    takeover: bool
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    outcome_code: str | None
    error_class: str | None
    finding: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedRecord:
    """A delivery recorded under the operation's key that did not become work."""

    id: int
    kind: str
    reason: str
    subscription: str
    broker_message_id: str | None
    payload_hash: bytes | None
    created_at: datetime
    redriven_at: datetime | None
    redriven_by: str | None
    redrive_reason: str | None
    redrive_outcome: str | None
    #: closed by a person (``fencebridge resolve``): when, by whom, why
    resolved_at: datetime | None = None
    resolved_by: str | None = None
    resolution_reason: str | None = None

    @property
    def open(self) -> bool:
        """Still awaiting a person: neither redriven nor resolved."""
        return self.redriven_at is None and self.resolved_at is None


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    """One recorded erasure of a tenant or of one operation (the record names them only by
    their keyed hashes)."""

    at: datetime
    actor: str
    reason: str
    #: the erasure named this one operation (erase --operation), not its whole tenant
    one_operation: bool = False


@dataclass(frozen=True, slots=True)
class ResolvedDelivery:
    """A rejected delivery ``fencebridge resolve`` closed (or, on a dry run, would close)."""

    id: int
    kind: str
    subscription: str
    #: the operation it was recorded under, when its identifiers could be read
    key: Key | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RejectedStatus:
    """Where a named rejected delivery stands, when a resolve did not close it."""

    id: int
    redriven_at: datetime | None
    redriven_by: str | None
    resolved_at: datetime | None
    resolved_by: str | None


@dataclass(frozen=True, slots=True)
class OperationHistory:
    """Everything the store keeps about one operation, read in one snapshot."""

    key: Key
    row: WorkRecord | None
    redrives: tuple[RedriveRecord, ...]
    rejected: tuple[RejectedRecord, ...]
    #: the newest attempts kept for the row, oldest first (removed with the row)
    attempts: tuple[AttemptRecord, ...] = ()

    @property
    def found(self) -> bool:
        return self.row is not None or bool(self.rejected) or bool(self.redrives)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedRow:
    """A row parked as unknown or quarantined, with what deciding its redrive needs."""

    key: Key
    state: State
    subscription: str
    job_type: str
    target_class: TargetClass
    schema_version: str | None
    fence: int
    attempts: int
    max_attempts: int
    intent_fence: int | None
    #: the approved payload; read only for unknown class C rows (their lookup needs it)
    payload: bytes | None
    #: the identity key the row was written under: its idempotency key derives from it
    identity_key_id: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantinedDelivery:
    """A delivery quarantined at the inbox and not yet redriven, with its raw body."""

    id: int
    subscription: str
    broker_message_id: str | None
    tenant_id: str | None
    operation_id: str | None
    job_type: str | None
    reason: str
    #: the raw body as received; None if it was not kept
    body: bytes | None


@dataclass(frozen=True, slots=True)
class RateWait:
    """A target's rate limit wait still ahead: no row of the job type and tenant is claimed
    before ``until``."""

    job_type: str
    tenant_id: str
    until: datetime
    #: the queued rows of the job type and tenant, due or not: what the wait holds back
    queued: int


@dataclass(frozen=True, slots=True)
class LiftedWait:
    """A rate limit wait an operator lifted (or, on a dry run, would have)."""

    job_type: str
    tenant_id: str
    #: when the wait would have ended
    until: datetime
    #: the rows it had scheduled that became due at once
    moved: int


@dataclass(frozen=True, slots=True)
class PurgeCounts:
    """What one purge batch (or a whole purge) removed."""

    work_rows: int = 0
    rejected_deliveries: int = 0
    payloads: int = 0
    #: erased operations' tombstones past the horizon
    tombstones: int = 0
    #: what shadow subscriptions recorded before the cutoff: deliveries, and operations
    shadow_deliveries: int = 0
    shadow_operations: int = 0

    def __add__(self, other: PurgeCounts) -> PurgeCounts:
        return PurgeCounts(
            self.work_rows + other.work_rows,
            self.rejected_deliveries + other.rejected_deliveries,
            self.payloads + other.payloads,
            self.tombstones + other.tombstones,
            self.shadow_deliveries + other.shadow_deliveries,
            self.shadow_operations + other.shadow_operations,
        )


@dataclass(frozen=True, slots=True)
class ErasureCounts:
    """What erasing one tenant (or one operation) removed, and the tombstones it left."""

    work_rows: int
    payloads: int
    rejected_deliveries: int
    redrive_audits: int
    tombstones: int = 0
    #: the scope's outbox messages removed: sent ones, and parked ones the caller dropped
    outbox_sent: int = 0
    outbox_parked: int = 0
    #: the identity keys the tombstones are hashed under
    tombstone_keys: tuple[int, ...] = ()
    #: recorded keys this erasure was the first to leave no tombstone under: a process holding
    #: no other key refuses to write new work from now on (migration 0024)
    missed_keys: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SeenOperation:
    """An operation a shadow subscription recorded: its job type and first payload hash."""

    key: Key
    job_type: str
    payload_hash: bytes
