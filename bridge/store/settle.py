"""The settling table family: every write made for a claim under its fence, and the sweep.

A claim is one statement (:mod:`bridge.store.claims`); from then on every write made for it
(heartbeat, settlement, intent, retry, rate limit wait, a class A business transaction)
carries the fence in its own ``WHERE`` clause::

    UPDATE work_item SET ... WHERE <key> AND fence = :fence AND state = 'claimed'

The database decides, inside the write, whether the writer still owns the row. Zero rows means
ownership moved on (a newer claim, the sweeper, a settlement): the write raises
:class:`~bridge.errors.LeaseLost` and the caller must stop and never retry it. Nothing here
reads the row, compares in Python and then writes; a review that finds such a sequence on
ownership has found a bug.

::

    queued ──claim──▶ claimed ──settle──▶ succeeded | failed_terminal | unknown | quarantined
      ▲                 │  │
      └──retry_later────┘  └─lease expired, attempts left──▶ claimed again (takeover, fence + 1)
                           └─lease expired, attempts exhausted──sweep──▶ unknown
    unknown | quarantined ──redrive (audited)──▶ queued

The lease is liveness only; the fence is safety. A lease can be any length without putting
safety at risk, which is what lets heartbeats follow progress instead of time. Every
settlement also ends the claim's attempt record, in the same statement; ``error_class`` (an
exception's class name, never its text) and ``finding`` (what a lookup by idempotency key
found) go there only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg

from bridge import sql
from bridge.database import Connection, milliseconds
from bridge.deadline import TransactionDeadline
from bridge.errors import DeadlineExceeded, LeaseLost
from bridge.store.arrays import TextArray
from bridge.store.db import Database, lost, ticket_params, tickets_params
from bridge.store.work import (
    ATTEMPT_HISTORY_DEFAULT,
    SWEEP_LIMIT_DEFAULT,
    UNSTARTED_CLAIMS_MAX,
    Settlement,
    Swept,
)
from bridge.types import State, Ticket


class PostgresFencedTransaction:
    """An open transaction in which the work row is locked under its fence (target class A).

    The handler writes its business rows through :attr:`connection`; :meth:`settle` marks the
    work row in the same transaction. Both commit together when the ``with`` block ends, or
    neither does.
    """

    def __init__(
        self,
        connection: Connection,
        ticket: Ticket,
        now: datetime | None,
        deadline: TransactionDeadline | None = None,
        *,
        history: int = ATTEMPT_HISTORY_DEFAULT,
    ) -> None:
        self.connection = connection
        self.ticket = ticket
        self._now = now
        self._history = history
        #: past it the transaction is cancelled and rolled back (None: no deadline)
        self.deadline = deadline
        self.settled: State | None = None

    def settle(
        self, state: State = State.SUCCEEDED, outcome_code: str = "ok", detail: str | None = None
    ) -> None:
        row = self.connection.execute(
            sql.statement("settle"),
            {
                **ticket_params(self.ticket),
                "state": state.value,
                "outcome_code": outcome_code,
                "outcome_detail": detail,
                "error_class": None,
                "finding": None,
                "now": self._now,
                "history": self._history,
            },
        ).fetchone()
        if row is None:  # cannot happen while we hold the row lock; kept as a guard
            raise lost(self.ticket, "settle")
        self.settled = state


class SettleStore:
    """The fenced writes of claims and the sweep of expired ones."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def settle(self, settlement: Settlement) -> None:
        """Move the claim's row to its settled state (succeeded, failed_terminal, unknown or
        quarantined) under the fence; raises LeaseLost, changing nothing, for a stale ticket."""
        if settlement.state in (State.QUEUED, State.CLAIMED):
            raise ValueError("settle moves a row to a settled state only")
        self._db.fenced_write(
            f"settle as {settlement.state.value}",
            "settle",
            settlement.ticket,
            state=settlement.state.value,
            outcome_code=settlement.outcome_code,
            outcome_detail=settlement.outcome_detail,
            error_class=settlement.error_class,
            finding=settlement.finding,
        )

    def heartbeat(self, ticket: Ticket, lease: timedelta) -> datetime:
        """Extend the lease under the fence; returns the new expiry or raises LeaseLost."""
        expires = self._db.fenced_write("heartbeat", "heartbeat", ticket, lease=lease)[0]
        assert isinstance(expires, datetime)
        return expires

    def heartbeat_many(self, tickets: Sequence[Ticket], lease: timedelta) -> list[Ticket]:
        """Extend many leases in one statement; returns the tickets whose fence was stale."""
        if not tickets:
            return []
        with self._db.connection("heartbeat") as conn:
            rows = conn.execute(
                sql.statement("heartbeat_many"),
                {**tickets_params(tickets), "lease": lease, "now": self._db.now()},
            ).fetchall()
        return stale(tickets, rows)

    def settle_many(self, settlements: Sequence[Settlement]) -> list[Ticket]:
        """Settle many claims in one statement; returns the tickets whose fence was stale."""
        if not settlements:
            return []
        settled_only(settlements, "settle_many")
        with self._db.connection("settle") as conn:
            rows = conn.execute(
                sql.statement("settle_many"),
                settlements_params(settlements, self._db.now(), self._db.attempt_history),
            ).fetchall()
        return stale([s.ticket for s in settlements], rows)

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
        """Back to the queue after ``backoff``; ``failed_terminal`` when no attempt is left.

        Only for attempts that confirmed nothing was applied. Returns the state the row took.
        """
        row = self._db.fenced_write(
            "retry later",
            "retry_later",
            ticket,
            backoff=backoff,
            outcome_code=outcome_code,
            outcome_detail=detail,
            error_class=error,
            finding=finding,
        )
        return State(row[0])

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
        """Back to the queue after ``retry_after`` (database clock) with the attempt given back,
        and the row's (job type, tenant) waiting as long: claims skip that key until then.

        Fenced like every settlement; raises LeaseLost, changing nothing, for a stale ticket.
        """
        self._db.fenced_write(
            "rate limited",
            "rate_limited",
            ticket,
            retry_after=retry_after,
            outcome_code=outcome_code,
            outcome_detail=detail,
            error_class=error,
            finding=finding,
        )

    def record_intent(self, ticket: Ticket) -> None:
        """Record, under the fence, that this claim is about to call a class D target."""
        self._db.fenced_write("record intent", "record_intent", ticket)

    def release(self, ticket: Ticket) -> None:
        """Give back a claim whose handler never started; the attempt is not counted."""
        self._db.fenced_write("release", "release", ticket)

    def withdraw_intent(self, ticket: Ticket) -> bool:
        """Give the row back with this claim's intent withdrawn (its class D call was not made:
        no standby confirmed the intent, :mod:`bridge.store.replication`) and the attempt not
        counted; False if the claim is gone."""
        try:
            self._db.fenced_write("withdraw intent", "withdraw_intent", ticket)
        except LeaseLost:
            return False
        return True

    @contextmanager
    def fenced_transaction(
        self, ticket: Ticket, *, deadline: timedelta | None = None
    ) -> Iterator[PostgresFencedTransaction]:
        """Open a transaction holding the work row's lock under the fence (target class A).

        Raises LeaseLost before yielding if the claim is gone. The business write and the
        transaction's ``settle`` commit together when the block exits cleanly; any exception
        rolls both back.

        With a ``deadline`` the transaction never outlives it: its statements and idle gaps
        are limited to it, a statement still running when it passes is cancelled, and a block
        that ends after it is rolled back instead of committed. Each of these raises
        :class:`~bridge.deadline.DeadlineExceeded`: rolled back, nothing was applied.
        """
        with self._db.connection("fenced transaction") as conn:
            watch: TransactionDeadline | None = None
            try:
                with conn.transaction():
                    row = conn.execute(
                        sql.statement("lock_claim"), ticket_params(ticket)
                    ).fetchone()
                    if row is None:
                        raise lost(ticket, "lock")
                    if deadline is None:
                        yield PostgresFencedTransaction(
                            conn, ticket, self._db.now(), history=self._db.attempt_history
                        )
                        return
                    bound = str(milliseconds(deadline))
                    conn.execute(
                        sql.statement("transaction_limits"),
                        {"statement_timeout": bound, "idle_timeout": bound},
                    )
                    with TransactionDeadline(conn, deadline) as watch:
                        yield PostgresFencedTransaction(
                            conn, ticket, self._db.now(), watch, history=self._db.attempt_history
                        )
                        watch.finish()  # past the deadline: raise, so nothing commits
            except psycopg.Error as exc:
                # Cancelled, timed out or cut off by the server because the deadline passed:
                # whatever the driver says, the transaction did not commit.
                if watch is not None and watch.expired:
                    raise DeadlineExceeded(watch.deadline) from exc
                raise

    def sweep(self, limit: int = SWEEP_LIMIT_DEFAULT, *, exclusive: bool = False) -> Swept:
        """Park expired claims with no attempt left as ``unknown``, except class D claims that
        never recorded an intent (no call was made), which go back to the queue while the row
        has had fewer than :data:`~bridge.store.work.UNSTARTED_CLAIMS_MAX` claims.

        With ``exclusive``, the sweep runs only if no other process is sweeping right now
        (a transaction-scoped advisory lock); otherwise it does nothing at once.
        """
        with self._db.connection("sweep") as conn, conn.transaction():
            if exclusive:
                got = conn.execute(sql.statement("sweep_lock")).fetchone()
                if not got or not got[0]:
                    return Swept([], [])
            rows = conn.execute(
                sql.statement("sweep"),
                {
                    "limit": limit,
                    "now": self._db.now(),
                    "history": self._db.attempt_history,
                    "aging": self._db.aging,
                    "unstarted_claims": UNSTARTED_CLAIMS_MAX,
                },
            ).fetchall()
        swept = Swept([], [])
        for t, o, f, state in rows:
            (swept.requeued if state == State.QUEUED else swept.parked).append(Ticket(t, o, int(f)))
        return swept


def settled_only(settlements: Sequence[Settlement], method: str) -> None:
    if any(s.state in (State.QUEUED, State.CLAIMED) for s in settlements):
        raise ValueError(f"{method} moves rows to a settled state only")


def settlements_params(
    settlements: Sequence[Settlement], now: datetime | None, history: int
) -> dict[str, Any]:
    return {
        "history": history,
        **tickets_params([s.ticket for s in settlements]),
        "state": TextArray([s.state.value for s in settlements]),
        "outcome_code": TextArray([s.outcome_code for s in settlements]),
        "outcome_detail": TextArray([s.outcome_detail for s in settlements]),
        "error_class": TextArray([s.error_class for s in settlements]),
        "finding": TextArray([s.finding for s in settlements]),
        "now": now,
    }


def stale(tickets: Sequence[Ticket], moved: Sequence[tuple[Any, ...]]) -> list[Ticket]:
    """The tickets no returned ``(tenant_id, operation_id, fence)`` row vouches for: their fence
    was no longer current, so the batch statement left their rows alone."""
    current = {(t, o, int(f)) for t, o, f in moved}
    return [t for t in tickets if (t.tenant_id, t.operation_id, t.fence) not in current]
