"""The work store as the runtime sees it: the protocol's writes, and the reads that keep it live.

Everything the bridge does while it runs goes through :class:`WorkStore`: the inbox writes a
batch (:meth:`~WorkStore.ingest`), the worker tier claims, heartbeats and settles under the
fence, the sweeper parks expired last attempts, held deliveries watch their rows, telemetry
reads the counts. Nothing here reads an operation's history or moves parked work: those are
:class:`~bridge.store.operator.OperatorStore`'s, which the runtime cannot reach. A fake for a
test implements only the methods its code calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Protocol

from bridge.types import (
    Claim,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    Rejection,
    State,
    Stats,
    Ticket,
)

if TYPE_CHECKING:
    from bridge.database import Connection
    from bridge.deadline import TransactionDeadline

SWEEP_LIMIT_DEFAULT = 1000
#: the claims a class D row may lose before its call (a lease expired, no intent recorded) and
#: still go back to the queue: nothing was called, but a row whose every claim dies (a
#: ``validate`` that takes its process down) must stop and wait for a person (``sweep.sql``)
UNSTARTED_CLAIMS_MAX: Final = 5
#: attempts kept per work row in its history (``[bridge] attempt_history``)
ATTEMPT_HISTORY_DEFAULT = 20
#: how much earlier in the claim order one priority step puts a row
#: (``[bridge] priority_aging_seconds``): a row of priority p overtakes p times this much of the
#: queue, and no more, so a waiting row of low priority is overtaken for a bounded time only
PRIORITY_AGING_DEFAULT = timedelta(seconds=60)
#: how long an erased operation's tombstone is kept: longer than any broker keeps a message
#: (SQS up to 14 days, Pub/Sub up to 31), so a redelivery of it is always recognised
TOMBSTONE_DAYS_DEFAULT = 35


@dataclass(frozen=True, slots=True)
class Settlement:
    """One row of a batch settlement."""

    ticket: Ticket
    state: State
    outcome_code: str
    outcome_detail: str | None = None
    #: for the attempt record only: the error's class name (never its text), a lookup's finding
    error_class: str | None = None
    finding: str | None = None


@dataclass(frozen=True, slots=True)
class Swept:
    """What one sweep did with the expired claims that had no attempt left."""

    #: parked ``unknown``: the last attempt may have acted
    parked: list[Ticket]
    #: class D rows whose claim expired before its intent (no call was made): queued again
    requeued: list[Ticket]


@dataclass(frozen=True, slots=True)
class SettledClaim:
    """What :meth:`WorkStore.settle_and_claim` did: the settlements' stale tickets, the rows
    claimed, and the claim's error when the claim failed (the settlements were then written
    alone, and ``claims`` is empty)."""

    stale: list[Ticket]
    claims: list[Claim]
    claim_error: Exception | None = None


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most ``total`` rows of a job type claimed at once, and ``per_tenant`` of one
    (job type, tenant), across every process (``None``: no such limit). The claim statements
    enforce it in the database, so every process claiming the job type must carry the same."""

    total: int | None = None
    per_tenant: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("total", self.total), ("per_tenant", self.per_tenant)):
            if value is not None and value < 1:
                raise ValueError(f"a concurrency limit's {name} is at least 1, not {value}")

    @property
    def limited(self) -> bool:
        return self.total is not None or self.per_tenant is not None


#: the periods a rate may be written per, and their length in seconds
RATE_PERIODS: Final = {"s": 1, "min": 60, "h": 3600}
#: the most runs a rate allows per period, and the largest burst
RATE_MAX: Final = 1_000_000
_RATE = re.compile(r"^([0-9]+)/(s|min|h)$")


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` runs per period of ``period`` seconds (1, 60 or 3600), written ``"50/s"``,
    ``"600/min"`` or ``"1000/h"``."""

    count: int
    period: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= RATE_MAX:
            raise ValueError(f"a rate's count is from 1 to {RATE_MAX}, not {self.count}")
        if self.period not in RATE_PERIODS.values():
            raise ValueError(f"a rate is per second, minute or hour, not per {self.period} s")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"<count>/s"``, ``"<count>/min"`` or ``"<count>/h"``; ValueError otherwise."""
        found = _RATE.match("".join(text.split()))
        if found is None:
            raise ValueError(
                'expected a whole number of runs per second, minute or hour, such as "50/s", '
                f'"600/min" or "1000/h", got {text!r}'
            )
        return cls(int(found.group(1)), RATE_PERIODS[found.group(2)])

    @property
    def per_second(self) -> float:
        return self.count / self.period

    def second(self) -> int:
        """One second of this rate, in whole runs, at least 1: the default burst."""
        return max(1, -(-self.count // self.period))

    def __str__(self) -> str:
        unit = next(u for u, seconds in RATE_PERIODS.items() if seconds == self.period)
        return f"{self.count}/{unit}"


@dataclass(frozen=True, slots=True)
class TokenRate:
    """At most ``burst`` runs of a job type at once and ``total`` after that, and
    ``burst_per_tenant`` and ``per_tenant`` of one (job type, tenant), across every process
    (``None``: no such rate; a burst is given with its rate). The claim statements keep one
    token bucket per key in the database, so every process claiming the job type must carry
    the same."""

    total: Rate | None = None
    burst: int | None = None
    per_tenant: Rate | None = None
    burst_per_tenant: int | None = None

    def __post_init__(self) -> None:
        for rate, burst, name in (
            (self.total, self.burst, "burst"),
            (self.per_tenant, self.burst_per_tenant, "burst_per_tenant"),
        ):
            if burst is not None and (rate is None or not 1 <= burst <= RATE_MAX):
                raise ValueError(f"{name} is from 1 to {RATE_MAX}, with its rate; not {burst}")

    @property
    def limited(self) -> bool:
        return self.total is not None or self.per_tenant is not None

    def buckets(self) -> list[int | None]:
        """The rates as the claims pass them: [count, period in microseconds, burst] of the
        job type, then of each tenant (None where absent)."""
        out: list[int | None] = []
        for rate, burst in ((self.total, self.burst), (self.per_tenant, self.burst_per_tenant)):
            if rate is None:
                out += [None, None, None]
            else:
                out += [rate.count, rate.period * 1_000_000, burst or rate.second()]
        return out


@dataclass(frozen=True, slots=True)
class WaitingCount:
    """Queued rows that are due but not claimable, by why: ``limit`` (their job type or
    (job type, tenant) holds all its concurrency slots) or ``rate`` (a rate limit wait, or no
    whole token left in the bucket of their job type or (job type, tenant))."""

    job_type: str
    tenant_id: str
    reason: str
    count: int


class FencedTransaction(Protocol):
    """An open transaction in which the work row is locked under its fence (target class A).

    The handler writes its business rows through :attr:`connection`; :meth:`settle` marks the
    work row in the same transaction. Both commit together, or neither does.
    """

    @property
    def connection(self) -> Connection: ...

    @property
    def ticket(self) -> Ticket: ...

    @property
    def deadline(self) -> TransactionDeadline | None:
        """Past it the transaction is cancelled and rolled back (None: no deadline)."""
        ...

    def settle(
        self, state: State = State.SUCCEEDED, outcome_code: str = "ok", detail: str | None = None
    ) -> None: ...


class KeyedStore(Protocol):
    """What every store offers: the identity keys it binds, and an end."""

    def use_identity_keys(
        self,
        current: int,
        held: Sequence[int],
        erased: Callable[[str, str], list[tuple[int, bytes]]] | None = None,
    ) -> None:
        """Write new rows under key ``current``; claim only rows written under a key in
        ``held``; find erased operations' tombstones by the hashes ``erased`` derives."""
        ...

    def close(self) -> None: ...


class WorkStore(KeyedStore, Protocol):
    """**Protocol**: the store the runtime depends on. Every write made for a claim carries
    its fence and raises :class:`~bridge.errors.LeaseLost` when the fence is no longer
    current; the caller stops and never retries that write."""

    def ingest(
        self, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None = None
    ) -> list[IngestResult]:
        """Write one received batch in one transaction; one result per delivery, in order.
        With ``claim``, new rows the hand-off claim would take (up to its limit) are written
        claimed for its worker and come back with their :class:`~bridge.types.Claim`."""
        ...

    def watch(self, keys: Sequence[Key]) -> dict[Key, tuple[State, bool]]:
        """State of each operation and whether its claim's lease is live (after_outcome acks)."""
        ...

    def claim(
        self,
        worker: str,
        limit: int,
        lease: timedelta,
        *,
        job_types: Sequence[str] | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` claimable rows (queued and due, or expired with attempts left)."""
        ...

    def claim_keys(self, worker: str, keys: Sequence[Key], lease: timedelta) -> list[Claim]:
        """Claim exactly these rows where they are claimable (hand-off after ingest)."""
        ...

    def use_concurrency_limits(self, limits: Mapping[str, ConcurrencyLimit]) -> None:
        """Claim rows of these job types only within their concurrency limits, which the claim
        statements enforce in the database across every process that carries them."""
        ...

    def concurrency_limited(self, job_type: str) -> bool:
        """Whether claims of ``job_type`` wait for a slot under a concurrency limit: a
        settlement of one of its rows may free a slot for another."""
        ...

    def use_token_rates(self, rates: Mapping[str, TokenRate]) -> None:
        """Claim rows of these job types only within their token rates, which the claim
        statements enforce in the database across every process that carries them."""
        ...

    def use_tenant_fairness(self, weights: Mapping[str, int] | None = None) -> None:
        """Claim tenants in turn, each taking its share of a claim by its weight."""
        ...

    def heartbeat(self, ticket: Ticket, lease: timedelta) -> datetime:
        """Extend the lease under the fence; returns the new expiry."""
        ...

    def heartbeat_many(self, tickets: Sequence[Ticket], lease: timedelta) -> list[Ticket]:
        """Extend many leases in one statement; returns the tickets whose fence was stale."""
        ...

    # ``error`` (an exception's class name, never its text) and ``finding`` (what a lookup by
    # idempotency key found) go to the attempt record only.

    def complete(
        self,
        ticket: Ticket,
        outcome_code: str = "ok",
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None: ...

    def fail_terminal(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None: ...

    def park_unknown(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None: ...

    def quarantine(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None: ...

    def settle_many(self, settlements: Sequence[Settlement]) -> list[Ticket]:
        """Settle many claims in one statement; returns the tickets whose fence was stale."""
        ...

    def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        worker: str,
        lease: timedelta,
        *,
        limit: int = 0,
        keys: Sequence[Key] | None = None,
        job_types: Sequence[str] | None = None,
    ) -> SettledClaim:
        """:meth:`settle_many`, then :meth:`claim_keys` of ``keys`` (or else :meth:`claim` of
        ``limit`` rows), in one transaction: one commit for both, and the claim sees the rows
        the settlements freed. A failed claim takes the settlements with it, so they are then
        written alone and the claim's error returned; a failed settlement or commit raises."""
        ...

    def keep_connection(self) -> None:
        """From now on this thread's calls use one connection (until :meth:`release_connection`
        or a call that fails), not the pool's oldest idle one each time: a loop that calls many
        times a second keeps its server process, and that process's caches, warm."""
        ...

    def release_connection(self) -> None:
        """Give the connection this thread kept back to the pool (nothing if it kept none)."""
        ...

    def complete_many(self, tickets: Sequence[Ticket], outcome_code: str = "ok") -> list[Ticket]:
        """Mark many operations succeeded; returns the tickets whose fence was stale."""
        ...

    def retry_later(
        self,
        ticket: Ticket,
        backoff: timedelta,
        outcome_code: str = "retry",
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> State:
        """Back to the queue after ``backoff``, or failed_terminal with no attempt left."""
        ...

    def record_intent(self, ticket: Ticket) -> None:
        """Record, under the fence, that this claim is about to call its target."""
        ...

    def release(self, ticket: Ticket) -> None:
        """Give back a claim whose handler never started; the attempt is not counted."""
        ...

    def fenced_transaction(
        self, ticket: Ticket, *, deadline: timedelta | None = None
    ) -> AbstractContextManager[FencedTransaction]:
        """A transaction holding the work row's lock under the fence (target class A)."""
        ...

    def sweep(self, limit: int = SWEEP_LIMIT_DEFAULT, *, exclusive: bool = False) -> Swept:
        """Park expired claims with no attempt left as ``unknown``, except class D claims that
        never recorded an intent, which go back to the queue; returns what it did."""
        ...

    def stats(self) -> Stats:
        """Counts by subscription, tenant and state; stalled claims; the oldest unknown."""
        ...

    def open_stats(self) -> Stats:
        """:meth:`stats` counting only open rows (queued, claimed) and parked ones (unknown,
        quarantined): read through their partial indexes, so its cost follows the backlog and
        not the history of succeeded and failed rows (the database gauges, every refresh)."""
        ...

    def rate_limited(
        self,
        ticket: Ticket,
        retry_after: timedelta,
        outcome_code: str = "rate_limited",
        *,
        detail: str | None = None,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """The target refused the call before acting: back to the queue after ``retry_after``
        with the attempt given back, and every row of the same job type and tenant waits as
        long (the limit is the target's, not the row's)."""
        ...

    def ingest_shadow(self, batch: Sequence[Delivery | Rejection]) -> list[IngestResult]:
        """Record a shadow subscription's batch apart from the work rows, each delivery decided
        as :meth:`ingest` would decide it; nothing it writes can be claimed."""
        ...

    def ingest_within_quota(
        self, batch: Sequence[Delivery | Rejection], quota: int, claim: InsertClaim | None = None
    ) -> list[IngestResult | QuotaDeferred]:
        """:meth:`ingest` (``claim`` as there), except that a new operation of a tenant whose
        open backlog (queued and claimed rows, every subscription) is at ``quota`` is not
        written: it is returned as :class:`QuotaDeferred` and must not be acknowledged.
        Replays, conflicts and rejections are decided as :meth:`ingest` decides them."""
        ...


@dataclass(frozen=True, slots=True)
class QuotaDeferred:
    """A delivery the inbox did not write: its tenant's open backlog was at the quota. The
    broker keeps it and hands it out again later; nothing of it is in the database."""

    key: Key
    #: the tenant's open rows the batch saw (counted up to the quota)
    backlog: int
