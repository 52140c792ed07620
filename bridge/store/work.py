"""The words of the work store's families: a settlement, a sweep's and a settle-and-claim's
answers, the claim limits (concurrency limits, token rates), the class A transaction a handler
writes through, a quota's deferral, and the defaults the families and the configuration share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Protocol

from bridge.types import (
    Claim,
    Key,
    State,
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
    """What :meth:`~bridge.store.claims.ClaimStore.settle_and_claim` did: the settlements'
    stale tickets, the rows claimed, and the claim's error when the claim failed (the
    settlements were then written alone, and ``claims`` is empty)."""

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


@dataclass(frozen=True, slots=True)
class QuotaDeferred:
    """A delivery the inbox did not write: its tenant's open backlog was at the quota. The
    broker keeps it and hands it out again later; nothing of it is in the database."""

    key: Key
    #: the tenant's open rows the batch saw (counted up to the quota)
    backlog: int
