"""The words of the protocol as values: operations, deliveries, claims and their states."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class State(enum.StrEnum):
    """The six states of a work row, and no others."""

    QUEUED = "queued"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED_TERMINAL = "failed_terminal"
    UNKNOWN = "unknown"
    QUARANTINED = "quarantined"

    @property
    def terminal(self) -> bool:
        """Succeeded or failed: nothing will happen to the row again."""
        return self in (State.SUCCEEDED, State.FAILED_TERMINAL)

    @property
    def parked(self) -> bool:
        """Waiting for a person: unknown outcome or uncertain input."""
        return self in (State.UNKNOWN, State.QUARANTINED)


class TargetClass(enum.StrEnum):
    """Where a job type's side effect lands, which decides what the fence can guarantee."""

    A = "A"  #: the same PostgreSQL database as the work table
    B = "B"  #: a store with conditional writes that carries the fence
    C = "C"  #: an external API with an idempotency key and a lookup by key
    D = "D"  #: neither: at most one attempt


class Decision(enum.StrEnum):
    """What the inbox made of one delivery."""

    NEW = "new"  #: a new operation: a work row was created
    REPLAY = "replay"  #: the operation exists with the same payload hash: nothing new
    CONFLICT = (
        "conflict"  #: the operation exists with another payload hash: rejected, nothing mutated
    )
    QUARANTINED = (
        "quarantined"  #: the delivery could not be decoded with confidence: recorded, not guessed
    )


@dataclass(frozen=True, slots=True)
class Key:
    """An operation's identity: the tenant is part of it everywhere."""

    tenant_id: str
    operation_id: str


def payload_digest(body: bytes) -> bytes:
    """The sha256 that binds an operation to its approved payload."""
    return hashlib.sha256(body).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """A decoded delivery, ready for the inbox."""

    tenant_id: str
    operation_id: str
    subscription: str
    job_type: str
    target_class: TargetClass
    #: the approved payload bytes: the part of the message the subscription says is hashed
    payload: bytes
    schema_version: str | None = None
    max_attempts: int = 5
    #: SQS FIFO message group or Pub/Sub ordering key: rows of one group are claimed in order
    ordering_key: str | None = None
    broker_message_id: str | None = None
    #: SQS ApproximateReceiveCount / Pub/Sub delivery_attempt, as reported by the broker
    receive_count: int | None = None
    #: the producer's W3C traceparent, kept for the process span
    trace_context: str | None = None
    #: claimed ahead of lower priorities, by ``priority`` times the priority aging
    priority: int = 0
    payload_hash: bytes = field(init=False)
    #: the operation's identity, made once: the inbox looks it up several times per delivery
    key: Key = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload_hash", payload_digest(self.payload))
        object.__setattr__(self, "key", Key(self.tenant_id, self.operation_id))


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A delivery the subscription's rules could not decode with confidence.

    It is recorded with its reason (and the raw body, so it can be re-decoded after the rules
    change) and then acknowledged: never guessed, never dropped.
    """

    subscription: str
    reason: str
    body: bytes | None = None
    broker_message_id: str | None = None
    tenant_id: str | None = None
    operation_id: str | None = None
    job_type: str | None = None


@dataclass(frozen=True, slots=True)
class IngestResult:
    """The inbox's answer for one delivery of a batch, in the batch's order."""

    decision: Decision
    key: Key | None
    #: the state of the existing row for a replay or conflict; for a new row ``queued``, or
    #: ``claimed`` where it was written claimed for the local pool (:class:`InsertClaim`)
    state: State | None = None
    #: the replay or conflict is with an erased operation's tombstone: no row exists
    erased: bool = False
    #: a new row written claimed, for the pool that asked (:class:`InsertClaim`) to run
    claim: Claim | None = None


@dataclass(frozen=True, slots=True)
class InsertClaim:
    """The local pool's request that the inbox write some new rows already claimed.

    The hand-off claim by key, made by the insert itself: the rows it would claim a moment
    later are written leased to ``worker`` under fence 1, at most ``limit`` of them (the slots
    the pool reserved), each for its job type's lease. Only job types in ``leases`` qualify,
    and the store takes only rows that claim would take.
    """

    worker: str
    #: the lease of each job type the pool runs
    leases: dict[str, timedelta]
    limit: int


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a worker must show with every write: the row and the fence it was given."""

    tenant_id: str
    operation_id: str
    fence: int

    @property
    def key(self) -> Key:
        return Key(self.tenant_id, self.operation_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A work row leased to one worker under a fence."""

    tenant_id: str
    operation_id: str
    fence: int
    #: this claim's attempt number; above 1, an earlier attempt may have acted
    attempts: int
    max_attempts: int
    subscription: str
    job_type: str
    target_class: TargetClass
    schema_version: str | None
    payload: bytes | None
    payload_hash: bytes
    lease_expires_at: datetime
    #: set when an earlier attempt recorded its intent to call a class C or D target: a request
    #: may have left (:func:`bridge.executors.intent.call_may_have_left`)
    intent_fence: int | None
    #: the claim took over an expired lease rather than a queued row
    takeover: bool
    trace_context: str | None = None
    broker_message_id: str | None = None
    receive_count: int | None = None
    ordering_key: str | None = None
    #: the identity key the row was written under: its idempotency key derives from it
    identity_key_id: int = 1
    #: what a worker shows with every write under this claim (made once: it keys the run's
    #: heartbeat and settlement, several times per run)
    ticket: Ticket = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ticket", Ticket(self.tenant_id, self.operation_id, self.fence))

    @property
    def key(self) -> Key:
        return Key(self.tenant_id, self.operation_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedriveFilter:
    """Which parked rows to send back to the queue. Empty fields match everything."""

    states: tuple[State, ...] = (State.UNKNOWN, State.QUARANTINED)
    subscription: str | None = None
    tenant_id: str | None = None
    job_type: str | None = None
    keys: tuple[Key, ...] | None = None
    #: with ``keys``: each key only while its fence is still this one (the fence a decision to
    #: redrive it was made at), so a row that was claimed and parked again meanwhile stays put
    fences: tuple[int, ...] | None = None
    limit: int = 1000

    def __post_init__(self) -> None:
        bad = [s for s in self.states if not s.parked]
        if bad:
            raise ValueError(f"only unknown and quarantined rows can be redriven, not {bad}")
        if self.fences is not None and (self.keys is None or len(self.fences) != len(self.keys)):
            raise ValueError("fences pair with keys: one fence per key")


@dataclass(frozen=True, slots=True)
class Redriven:
    """One row a redrive sent back to the queue (or would have, on a dry run)."""

    key: Key
    from_state: State
    fence: int
    attempts: int


@dataclass(frozen=True, slots=True)
class StateCount:
    subscription: str
    tenant_id: str
    state: State
    count: int


@dataclass(frozen=True, slots=True)
class Stats:
    """What an operator needs to see at a glance."""

    counts: tuple[StateCount, ...]
    #: claimed rows whose lease has expired: a worker stopped making progress
    stalled_claims: int
    #: age in seconds of the oldest row parked as unknown, if any
    oldest_unknown_seconds: float | None
    #: rejected deliveries not yet redriven, by kind
    rejected: dict[str, int]

    def total(self, state: State) -> int:
        return sum(c.count for c in self.counts if c.state is state)


@dataclass(frozen=True, slots=True, kw_only=True)
class RawDelivery:
    """What a consumer hands over: one broker message, broker-neutral and not yet trusted."""

    subscription: str
    message_id: str | None
    body: bytes
    attributes: Mapping[str, str]
    #: SQS ApproximateReceiveCount / Pub/Sub delivery_attempt
    receive_count: int | None = None
    #: SQS MessageGroupId / Pub/Sub ordering key
    ordering_key: str | None = None
    #: the W3C traceparent, if the consumer found one
    trace_context: str | None = None
