"""Many workers, one store: no row is ever held by two claims, every row settles exactly once.

Sixteen threads claim and settle five thousand rows through one ``PostgresStore``. Some claims
are deliberately stalled: the worker keeps the ticket, waits until another worker has taken
the row over after the lease lapsed, and only then tries to heartbeat and complete with its
stale ticket. Every claim and every fenced write is recorded; afterwards the history is checked
against the protocol's rules and against the table.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge.errors import LeaseLost
from bridge.store import PostgresStore, Settlement
from bridge.types import Claim, Delivery, Key, State, TargetClass, Ticket

ROWS = 5000
WORKERS = 16
BATCH = 8
LEASE = timedelta(seconds=1)
MAX_ATTEMPTS = 10
STALL_EVERY = 250  # these rows' first claim stalls past its lease
RETRY_EVERY = 97  # these rows' first attempt goes back to the queue
FAIL_EVERY = 101  # these rows fail for good
# A wedged run fails instead of hanging (liveness guards, never timing assertions).
DEADLINE_SECONDS = 240
NO_PROGRESS_SECONDS = 30

Db = psycopg.Connection[tuple[Any, ...]]


def index(key: Key) -> int:
    return int(key.operation_id.removeprefix("op-"))


@dataclass(frozen=True)
class Claimed:
    key: Key
    fence: int
    attempts: int
    worker: str
    takeover: bool
    lease_expires_at: datetime

    @property
    def at(self) -> datetime:
        """The database time of the claim: its lease is ``now() + LEASE``."""
        return self.lease_expires_at - LEASE


@dataclass(frozen=True)
class Write:
    """One fenced write attempt and what the store answered."""

    kind: str  # heartbeat | retry_later | settle
    key: Key
    fence: int
    worker: str
    ok: bool
    #: the state a settlement asked for
    state: State | None = None
    #: the new lease end a single heartbeat returned (batch heartbeats do not say)
    expires: datetime | None = None
    stalled: bool = False


@dataclass
class History:
    lock: threading.Lock = field(default_factory=threading.Lock)
    claims: list[Claimed] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    latest_fence: dict[Key, int] = field(default_factory=dict)
    stale_tried: set[Ticket] = field(default_factory=set)
    settled: int = 0
    progress_at: float = field(default_factory=time.monotonic)
    errors: list[BaseException] = field(default_factory=list)

    def claimed(self, worker: str, claims: list[Claim]) -> None:
        with self.lock:
            for c in claims:
                self.claims.append(
                    Claimed(c.key, c.fence, c.attempts, worker, c.takeover, c.lease_expires_at)
                )
                self.latest_fence[c.key] = max(c.fence, self.latest_fence.get(c.key, 0))

    def wrote(self, *writes: Write) -> None:
        with self.lock:
            self.writes.extend(writes)
            settled = sum(1 for w in writes if w.ok and w.kind == "settle")
            if settled:
                self.settled += settled
                self.progress_at = time.monotonic()

    def tried_stale(self, ticket: Ticket) -> None:
        with self.lock:
            self.stale_tried.add(ticket)

    def stale_was_tried(self, ticket: Ticket) -> bool:
        with self.lock:
            return ticket in self.stale_tried

    def taken_over(self, ticket: Ticket) -> bool:
        with self.lock:
            return self.latest_fence.get(ticket.key, 0) > ticket.fence

    def done(self) -> bool:
        with self.lock:
            return self.settled >= ROWS

    def wedged(self) -> bool:
        with self.lock:
            return time.monotonic() - self.progress_at > NO_PROGRESS_SECONDS


def outcome(ticket: Ticket) -> State:
    return State.FAILED_TERMINAL if index(ticket.key) % FAIL_EVERY == 0 else State.SUCCEEDED


class Worker:
    """One worker thread; ``batch`` workers heartbeat and settle with the batch calls."""

    def __init__(self, name: str, store: PostgresStore, history: History, batch: bool) -> None:
        self.name = name
        self.store = store
        self.history = history
        self.batch = batch
        self.stalled: list[Ticket] = []
        self.held_back: list[Ticket] = []

    def run(self, deadline: float) -> None:
        try:
            while time.monotonic() < deadline and not self.history.wedged():
                claims = self.store.claims.claim(self.name, BATCH, LEASE)
                self.history.claimed(self.name, claims)
                work = self.triage(claims)
                self.wake_stalled()
                work.extend(self.release_held_back())
                if self.batch:
                    self.settle_batch(work)
                else:
                    self.settle_one_by_one(work)
                if not claims:
                    if self.history.done() and not self.stalled and not self.held_back:
                        return
                    time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
            self.history.errors.append(exc)

    def triage(self, claims: list[Claim]) -> list[Ticket]:
        """Stall or requeue the chosen first claims; the rest is work to settle."""
        work: list[Ticket] = []
        for c in claims:
            i = index(c.key)
            if c.fence == 1 and i % STALL_EVERY == 0:
                self.stalled.append(c.ticket)  # paused: the lease will lapse
            elif c.fence == 2 and i % STALL_EVERY == 0:
                # Keep the row claimed until the stalled worker has tried its stale writes, so
                # they meet a row that is claimed under a newer fence, not a settled one.
                self.held_back.append(c.ticket)
            elif c.fence == 1 and i % RETRY_EVERY == 0:
                self.store.settle.retry_later(c.ticket, timedelta(0), "busy")
                self.history.wrote(Write("retry_later", c.key, c.fence, self.name, ok=True))
            else:
                work.append(c.ticket)
        return work

    def release_held_back(self) -> list[Ticket]:
        ready = [
            t
            for t in self.held_back
            if self.history.stale_was_tried(Ticket(t.tenant_id, t.operation_id, t.fence - 1))
        ]
        for t in ready:
            self.held_back.remove(t)
        return ready

    def detail(self, ticket: Ticket) -> str:
        return f"{self.name}/{ticket.fence}"

    def settle_batch(self, work: list[Ticket]) -> None:
        if not work:
            return
        stale = set(self.store.settle.heartbeat_many(work, LEASE))
        self.history.wrote(
            *(Write("heartbeat", t.key, t.fence, self.name, t not in stale) for t in work)
        )
        settlements = [
            Settlement(t, outcome(t), "done", self.detail(t)) for t in work if t not in stale
        ]  # a ticket found stale is dropped: ownership lost, never retried
        refused = set(self.store.settle.settle_many(settlements))
        self.history.wrote(
            *(
                Write(
                    "settle",
                    s.ticket.key,
                    s.ticket.fence,
                    self.name,
                    s.ticket not in refused,
                    s.state,
                )
                for s in settlements
            )
        )

    def settle_one_by_one(self, work: list[Ticket]) -> None:
        for t in work:
            try:
                expires = self.store.settle.heartbeat(t, LEASE)
            except LeaseLost:
                self.history.wrote(Write("heartbeat", t.key, t.fence, self.name, ok=False))
                continue
            self.history.wrote(
                Write("heartbeat", t.key, t.fence, self.name, ok=True, expires=expires)
            )
            state = outcome(t)
            try:
                if state is State.SUCCEEDED:
                    self.store.settle.settle(
                        Settlement(t, State.SUCCEEDED, "done", outcome_detail=self.detail(t))
                    )
                else:
                    self.store.settle.settle(
                        Settlement(t, State.FAILED_TERMINAL, "done", outcome_detail=self.detail(t))
                    )
            except LeaseLost:
                ok = False
            else:
                ok = True
            self.history.wrote(Write("settle", t.key, t.fence, self.name, ok, state))

    def wake_stalled(self) -> None:
        """Wake up after the takeover and carry on with the old ticket, as a paused worker does."""
        for t in [t for t in self.stalled if self.history.taken_over(t)]:
            self.stalled.remove(t)
            if self.batch:
                beat = self.store.settle.heartbeat_many([t], LEASE) == []
                done = (
                    self.store.settle.settle_many(
                        [Settlement(t, State.SUCCEEDED, "done") for t in [t]]
                    )
                    == []
                )
            else:
                beat = self.attempt(lambda t=t: self.store.settle.heartbeat(t, LEASE))
                done = self.attempt(
                    lambda t=t: self.store.settle.settle(
                        Settlement(t, State.SUCCEEDED, "done", outcome_detail=self.detail(t))
                    )
                )
            self.history.wrote(
                Write("heartbeat", t.key, t.fence, self.name, beat, stalled=True),
                Write("settle", t.key, t.fence, self.name, done, State.SUCCEEDED, stalled=True),
            )
            self.history.tried_stale(t)

    @staticmethod
    def attempt(write: Callable[[], object]) -> bool:
        """Run one fenced write: True if it was accepted, False if the fence was stale."""
        try:
            write()
        except LeaseLost:
            return False
        return True


@pytest.mark.slow
def test_sixteen_workers_never_share_a_row_and_settle_each_exactly_once(
    store: PostgresStore, db: Db
) -> None:
    assert store.pool.max_size >= WORKERS
    store.inbox.ingest(
        [
            Delivery(
                tenant_id=f"t{i % 3}",
                operation_id=f"op-{i:05d}",
                subscription="refunds",
                job_type="refund",
                target_class=TargetClass.A,
                payload=b"{}",
                max_attempts=MAX_ATTEMPTS,
            )
            for i in range(ROWS)
        ]
    )
    history = History()
    workers = [Worker(f"w{n:02d}", store, history, batch=n % 2 == 0) for n in range(WORKERS)]
    deadline = time.monotonic() + DEADLINE_SECONDS
    threads = [threading.Thread(target=w.run, args=(deadline,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert history.errors == []
    assert history.done(), f"only {history.settled} of {ROWS} rows settled before the deadline"

    claims: dict[Key, list[Claimed]] = defaultdict(list)
    for c in history.claims:
        claims[c.key].append(c)
    writes: dict[Key, list[Write]] = defaultdict(list)
    for w in history.writes:
        writes[w.key].append(w)
    assert len(claims) == ROWS

    for key, held in claims.items():
        held.sort(key=lambda c: c.fence)
        # Fences are unique and increase by one per claim; the attempt count follows them.
        assert [c.fence for c in held] == list(range(1, len(held) + 1)), key
        assert [c.attempts for c in held] == [c.fence for c in held], key
        assert held[0].takeover is False, key
        for before, after in itertools.pairwise(held):
            mine = [w for w in writes[key] if w.fence == before.fence]
            released = [w for w in mine if w.kind == "retry_later"]
            if after.takeover:
                # The previous holder never let go; its lease, with every extension it was
                # granted, had ended before the next claim.
                assert released == [], key
                ends = [before.lease_expires_at, *(w.expires for w in mine if w.expires)]
                assert max(ends) < after.at, key
            else:
                assert [w.ok for w in released] == [True], key

    for key, attempts in writes.items():
        final = claims[key][-1]
        wins = [w for w in attempts if w.kind == "settle" and w.ok]
        assert len(wins) == 1, (key, wins)  # exactly one settlement per row
        (win,) = wins
        assert (win.fence, win.worker) == (final.fence, final.worker), key
        for w in attempts:
            holder = claims[key][w.fence - 1]
            assert w.worker == holder.worker, (key, w)  # only the holder ever wrote
            if not w.ok:
                assert w.fence < final.fence, (key, w)  # only stale tickets were refused

    stalled = [w for w in history.writes if w.stalled]
    assert len(stalled) == 2 * len(range(0, ROWS, STALL_EVERY))
    assert [w for w in stalled if w.ok] == []  # every stale heartbeat and complete refused
    order = {w: n for n, w in enumerate(history.writes)}
    for w in stalled:
        (win,) = [x for x in writes[w.key] if x.kind == "settle" and x.ok]
        assert order[w] < order[win], w  # refused while a newer claim held the row
    takeovers = [c for c in history.claims if c.takeover]
    assert len(takeovers) >= len(range(0, ROWS, STALL_EVERY))
    retried = [w for w in history.writes if w.kind == "retry_later"]
    assert len(retried) == len(range(0, ROWS, RETRY_EVERY)) - 1  # op-00000 stalls instead

    table = {
        Key(t, o): tuple(rest)
        for t, o, *rest in db.execute(
            "SELECT tenant_id, operation_id, state, fence, attempts, outcome_detail,"
            " lease_owner, lease_expires_at FROM work_item"
        ).fetchall()
    }
    assert len(table) == ROWS
    for key, held in claims.items():
        (win,) = [w for w in writes[key] if w.kind == "settle" and w.ok]
        assert win.state is not None
        final = held[-1]
        assert table[key] == (
            win.state.value,
            final.fence,
            final.attempts,
            f"{win.worker}/{win.fence}",
            win.worker,  # the row keeps the owner whose fence settled it
            None,
        ), key
    stats = store.operator.stats()
    assert stats.total(State.SUCCEEDED) + stats.total(State.FAILED_TERMINAL) == ROWS
    assert stats.total(State.FAILED_TERMINAL) == len(range(0, ROWS, FAIL_EVERY))
