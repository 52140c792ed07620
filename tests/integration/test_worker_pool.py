"""The worker pool on real PostgreSQL: draining, hand-off, progress heartbeats, stopping, sweeping.

Leases here are real (the database clock): a stuck handler must lose its lease by time, a
healthy one keep it by reporting progress. Tests wait by polling the database with a deadline;
nothing asserts how long anything took.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge import sql
from bridge.database import APPLICATION_NAME
from bridge.demo import balances, invoices, payments
from bridge.demo.provider import PaymentClient, PaymentProvider
from bridge.executors.registry import Registry
from bridge.handlers import (
    ConditionalWriteHandler,
    Context,
    RetryPolicy,
    Success,
    TerminalFailure,
    UnfencedHandler,
)
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.runtime.sweeper import Sweeper
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.types import Claim, Decision, Delivery, Key, RawDelivery, State, Ticket
from tests.support.clock import Clock
from tests.support.deliveries import for_job
from tests.support.held import HeldRows
from tests.support.policy import with_policy
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"worker-pool-tests-identity-secret")
DEADLINE = 60.0
POLL = 0.05


def states(db: Db) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {s: int(n) for s, n in rows}


def row(db: Db, operation: str, tenant: str = "t1") -> dict[str, Any]:
    cur = db.execute(
        "SELECT state, fence, attempts, lease_owner, lease_expires_at, outcome_code"
        "  FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (tenant, operation),
    )
    found = cur.fetchone()
    assert found is not None
    return dict(zip([c.name for c in cur.description or ()], found, strict=True))


def lapsed(db: Db, operation: str) -> bool:
    found = db.execute(
        "SELECT lease_expires_at < now() FROM work_item WHERE operation_id = %s", (operation,)
    ).fetchone()
    return bool(found and found[0])


class Recorder:
    """Every event the pool reports, in order: (event, operation, fence, detail)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.log: list[tuple[str, str, int, str]] = []

    def _add(self, event: str, claim: Claim, detail: str) -> None:
        with self._lock:
            self.log.append((event, claim.operation_id, claim.fence, detail))

    def of(self, event: str) -> list[tuple[str, int, str]]:
        with self._lock:
            return [(op, fence, detail) for e, op, fence, detail in self.log if e == event]

    def claimed(self, claim: Claim) -> None:
        self._add("claimed", claim, "takeover" if claim.takeover else "")

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self._add("settled", claim, state.value)

    def lease_lost(self, claim: Claim, action: str) -> None:
        self._add("lease_lost", claim, action)

    def fenced_out(self, claim: Claim) -> None:
        self._add("fenced_out", claim, "")

    def reconciled(self, claim: Claim, finding: str) -> None:
        self._add("reconciled", claim, finding)

    def settle_unknown(self, claim: Claim, action: str) -> None:
        self._add("settle_unknown", claim, action)

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        self._add("rate_wait_clamped", claim, str(asked))


@pytest.fixture
def pools(store: PostgresStore) -> Iterator[Callable[..., WorkerPool]]:
    """Start worker pools on the test's store; every pool still running is stopped at the end."""
    started: list[WorkerPool] = []

    def start(registry: Registry, **options: Any) -> WorkerPool:
        options.setdefault("poll_interval", POLL)
        pool = WorkerPool(store, registry, HASHER, **options)
        started.append(pool)
        pool.start()
        return pool

    yield start
    for pool in started:
        pool.stop(deadline=5)


class Notify(UnfencedHandler):
    """A class D target in memory: records each call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def call(self, ctx: Context) -> None:
        with self._lock:
            self.calls.append((ctx.tenant_id, ctx.operation_id))


class Quick(ConditionalWriteHandler):
    """Succeeds at once, recording the order in which operations ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ran: list[str] = []

    def handle(self, ctx: Context) -> None:
        with self._lock:
            self.ran.append(ctx.operation_id)


class StuckOnce(ConditionalWriteHandler):
    """Attempt 1 hangs without reporting progress until released; later attempts succeed."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()

    def handle(self, ctx: Context) -> Success:
        if ctx.attempt == 1:
            self.started.set()
            self.release.wait(DEADLINE)
            self.returned.set()
            return Success("late")
        return Success("taken_over")


# -- draining ------------------------------------------------------------------------------------


def test_the_pool_drains_a_mixed_workload_of_every_target_class(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    invoices.install(db)
    balances.install(db)
    notify = Notify()
    with PaymentProvider() as provider:
        registry = Registry()
        registry.register(invoices.JOB_TYPE, invoices.RefundInvoice())
        registry.register(balances.JOB_TYPE, balances.SetBalance(store.pool.connection))
        registry.register(
            payments.JOB_TYPE, payments.ChargeCustomer(PaymentClient(provider.url, timeout=5))
        )
        registry.register("notify", notify, retry=RetryPolicy(max_attempts=1))
        batch = []
        for tenant in ("t1", "t2"):
            for i in range(4):
                invoices.add_invoice(db, tenant, f"inv-{i}", amount=100 + i)
                balance = {"account_id": "a", "balance": i, "currency": "eur"}
                work: dict[str, tuple[str, dict[str, object]]] = {
                    invoices.JOB_TYPE: ("refund", {"invoice_id": f"inv-{i}"}),
                    balances.JOB_TYPE: ("balance", balance),
                    payments.JOB_TYPE: ("charge", {"amount": 100 + i, "currency": "eur"}),
                    "notify": ("notify", {}),
                }
                for job, (name, payload) in work.items():
                    batch.append(for_job(registry, job, f"{name}-{i}", payload, tenant=tenant))
        store.inbox.ingest(batch)

        pool = pools(registry, threads=4)
        eventually(lambda: states(db) == {"succeeded": len(batch)}, "every row succeeded")
        report = pool.stop(deadline=10)

        assert len(provider.ledger()) == 8
        assert len({c.idempotency_key for c in provider.ledger()}) == 8
    assert report.abandoned == 0
    counts = pool.counts.snapshot()
    assert counts == {"claimed": len(batch), "settled.succeeded": len(batch)}
    assert sorted(notify.calls) == sorted(
        (t, f"notify-{i}") for t in ("t1", "t2") for i in range(4)
    )
    refunded = db.execute("SELECT count(*) FROM demo_invoice WHERE status = 'refunded'").fetchone()
    assert refunded == (8,)
    assert db.execute("SELECT count(*), max(writes) FROM demo_balance").fetchone() == (8, 1)


class Refuses(ConditionalWriteHandler):
    """Every call ends in a terminal failure, raised from the error that caused it."""

    def handle(self, ctx: Context) -> None:
        try:
            raise LookupError("no such account")
        except LookupError as exc:
            raise TerminalFailure("refused") from exc


@pytest.mark.slow
def test_a_run_leaves_nothing_for_the_cyclic_collector(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    """Every run's claim, context and bookkeeping are freed by reference counting when it
    ends: none is left in a reference cycle. A cycle per run made the collector run every few
    dozen runs, and its full passes (tens of milliseconds holding the interpreter lock) grew
    with the backlog held in memory."""
    balances.install(db)
    registry = Registry()
    registry.register("quick", Quick())
    registry.register("refuses", Refuses())
    registry.register("notify", Notify(), retry=RetryPolicy(max_attempts=1))
    registry.register(balances.JOB_TYPE, balances.SetBalance(store.pool.connection))
    jobs = ["quick", "refuses", "notify", balances.JOB_TYPE]
    payloads: dict[str, object] = {
        balances.JOB_TYPE: {"account_id": "a", "balance": 1, "currency": "eur"}
    }
    batch = [
        for_job(registry, job, f"op-{i}", payloads.get(job), tenant=f"t{i % 7}")
        for i in range(1_000)
        for job in [jobs[i % len(jobs)]]
    ]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage to look at
    try:
        store.inbox.ingest(batch)
        pool = pools(registry, threads=8, prefetch=8)
        eventually(
            lambda: states(db) == {"succeeded": 750, "failed_terminal": 250}, "every row settled"
        )
        pool.stop(deadline=10)
        del pool
        gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    per_run = {"Claim", "Context", "InFlight", "Settlement", "Run", "_RunEnd", "RunSettler"}
    assert {kind: kinds[kind] for kind in per_run if kinds[kind]} == {}


def test_hand_off_keys_do_not_hold_back_older_queued_rows_when_the_general_claim_is_due(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    """Rows another process queued (or a retry, or a redrive) are not handed off; the general
    claim, due here at the start, takes them in their order beside the handed-off key, which
    runs once, after them."""
    quick = Quick()
    registry = Registry()
    registry.register("quick", quick)
    older = [f"old-{i}" for i in range(5)]
    store.inbox.ingest([for_job(registry, "quick", op) for op in [*older, "fresh"]])

    recorder = Recorder()
    pool = WorkerPool(store, registry, HASHER, threads=1, poll_interval=POLL, events=recorder)
    pool.hand_off([(Key("t1", "fresh"), "quick")])
    pool.start()
    try:
        eventually(lambda: states(db) == {"succeeded": 6}, "every row succeeded")
    finally:
        pool.stop(deadline=10)

    assert quick.ran == [*older, "fresh"]
    assert [op for op, _, _ in recorder.of("claimed")] == [*older, "fresh"]


class Gate(ConditionalWriteHandler):
    """Every run waits for the gate, reporting progress (its lease is renewed meanwhile), then
    records its operation and fence."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self.runs: list[tuple[str, int]] = []

    def handle(self, ctx: Context) -> None:
        while not self.gate.wait(0.02):
            ctx.progress()
        with self._lock:
            self.runs.append((ctx.operation_id, ctx.fence))


#: the first rows claimed after the gate opens within which the waiting rows must come: the
#: four held by the gate, then three rounds of four
WITHIN = 4 + 3 * 4


@pytest.mark.slow
def test_a_backlog_fed_through_the_inbox_is_claimed_in_the_general_claims_order(
    store: PostgresStore, db: Db
) -> None:
    """Tenant fairness on, four threads held by their first runs while a flood of 1,500
    deliveries of one tenant comes through the pool's own inbox (batches of 10, every fifth
    sent twice, one conflicting redelivery). Meanwhile a crashed worker's lease lapses,
    another process queues a row, and the inbox writes a quiet tenant's delivery and one of
    the flood's with priority 5. The hand-off never holds more keys than the pool's four
    slots, and once the runs go on, the crashed row (taken over), the other process's row, the
    quiet tenant's and the urgent one are claimed within the first rounds, not behind the
    flood; every connection of the pool is killed mid-drain, and every row still runs, once
    unless the fault cut its batch."""
    handler = Gate()
    registry = Registry()
    registry.register("quick", handler, lease=timedelta(seconds=2))
    fair = PostgresStore(store.pool)
    fair = with_policy(fair, fairness={})
    events = Recorder()
    pool = WorkerPool(fair, registry, HASHER, threads=4, poll_interval=POLL, events=events)

    def decode(raw: RawDelivery) -> Delivery:
        attributes = raw.attributes
        made = for_job(registry, "quick", attributes["op"], tenant=attributes["tenant"])
        return replace(made, payload=raw.body, priority=int(attributes.get("priority", "0")))

    def raw(op: str, tenant: str = "flood", body: bytes = b"{}", **extra: str) -> RawDelivery:
        attributes = {"op": op, "tenant": tenant, **extra}
        return RawDelivery(subscription="jobs", message_id=None, body=body, attributes=attributes)

    inbox = Inbox(fair.inbox, decode, pool=pool)
    flood = [f"flood-{i:04d}" for i in range(1500)]
    held: list[int] = []
    pool.start()
    try:
        for n, start in enumerate(range(0, len(flood), 10)):
            batch = [raw(op) for op in flood[start : start + 10]]
            inbox.write(batch)
            held.append(len(pool._handoff))
            if n % 5 == 0:
                assert {w.decision for w in inbox.write(batch)} == {Decision.REPLAY}
        (conflict,) = inbox.write([raw(flood[7], body=b'{"other": 1}')])
        assert conflict.decision is Decision.CONFLICT
        store.inbox.ingest([for_job(registry, "quick", "crashed", tenant="other")])
        (crashed,) = store.claims.claim_keys(
            "crashed", [Key("other", "crashed")], timedelta(seconds=1)
        )
        store.inbox.ingest(
            [for_job(registry, "quick", "replica", tenant="other")]
        )  # not handed off
        inbox.write([raw("quiet-1", tenant="quiet")])
        inbox.write([raw("urgent", priority="5")])
        held.append(len(pool._handoff))
        eventually(lambda: lapsed(db, "crashed"), "the crashed worker's lease to lapse")

        handler.gate.set()
        eventually(lambda: len(handler.runs) >= 300, "a fifth of the rows ran")
        killed = db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        ).fetchall()
        assert killed, "the pool's connections were found and killed"
        eventually(lambda: states(db) == {"succeeded": 1504}, "every row settled", DEADLINE)
    finally:
        pool.stop(deadline=10)

    assert max(held) <= 4, f"the hand-off held {max(held)} keys for a pool of 4 slots"
    order = [op for op, _, _ in events.of("claimed")]
    first = order[:4]  # written claimed into the idle slots before the flood filled them
    assert set(first) <= set(flood)
    for waiting in ("crashed", "replica", "quiet-1", "urgent"):
        assert order.index(waiting) < WITHIN, (waiting, order.index(waiting), order[:WITHIN])
    assert ("crashed", 2, "takeover") in events.of("claimed")
    assert crashed.fence == 1

    lost = {op for op, _, _ in events.of("settle_unknown")}
    twice = {op for (op,) in db.execute("SELECT operation_id FROM work_item WHERE fence > 1")}
    assert twice - {"crashed"} <= lost, "only the crashed row and the rows the fault cut ran again"
    ran = Counter(op for op, _ in handler.runs)
    assert set(ran) == {*flood, "crashed", "replica", "quiet-1", "urgent"}
    assert {op for op, n in ran.items() if n > 1} <= lost


class FailsEvery(ConditionalWriteHandler):
    """Refuses every ``n``-th operation (a confirmed failure); the others succeed."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._lock = threading.Lock()
        self.ran: list[str] = []

    def handle(self, ctx: Context) -> None:
        with self._lock:
            self.ran.append(ctx.operation_id)
        if int(ctx.operation_id.rsplit("-", 1)[1]) % self._n == 0:
            raise TerminalFailure("refused")


class Together:
    """Records what each settlement batch was written with: the keys it settled and the keys
    the claim in its transaction took, or that it was written alone."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self._lock = threading.Lock()
        #: (keys settled, keys claimed in the same transaction, whether by hand-off keys)
        self.batches: list[tuple[list[Key], list[Key], bool]] = []
        self.alone: list[int] = []  # sizes of batches written with no claim
        settle_and_claim, settle_many = store.claims.settle_and_claim, store.settle.settle_many

        def together(settlements: Any, *args: Any, **kwargs: Any) -> Any:
            done = settle_and_claim(settlements, *args, **kwargs)
            with self._lock:
                self.batches.append(
                    (
                        [s.ticket.key for s in settlements],
                        [c.key for c in done.claims],
                        bool(kwargs.get("keys")),
                    )
                )
            return done

        def alone(settlements: Any) -> Any:
            with self._lock:
                self.alone.append(len(settlements))
            return settle_many(settlements)

        monkeypatch.setattr(store.claims, "settle_and_claim", together)
        monkeypatch.setattr(store.settle, "settle_many", alone)


@pytest.mark.slow
def test_settlements_commit_with_the_claims_that_refill_their_workers(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer writing faster than the pool runs: the new rows the pool has room for are
    written claimed, the rest queued (handed over, by key while a round takes them all, else
    left to the general claim's order), and each batch of settlements is written in the
    transaction of the claim that refills the workers it frees: one commit, so the rows it
    settled and the rows it claimed carry the same transaction time (a batch with nothing to
    claim is written alone). 1,200 deliveries in batches of 10, every fifth batch sent twice
    (replays, not handed over again), one conflicting redelivery, every 50th operation refused
    by its target; each row runs once, under its first fence."""
    handler = FailsEvery(50)
    registry = Registry()
    registry.register("quick", handler)
    pool = pools(registry, threads=8)
    together = Together(store, monkeypatch)

    def decode(raw: RawDelivery) -> Delivery:
        return replace(for_job(registry, "quick", raw.attributes["op"]), payload=raw.body)

    def raw(op: str, body: bytes) -> RawDelivery:
        return RawDelivery(subscription="jobs", message_id=None, body=body, attributes={"op": op})

    inbox = Inbox(store.inbox, decode, pool=pool)
    ops = [f"op-{i:04d}" for i in range(1200)]
    for n, start in enumerate(range(0, len(ops), 10)):
        batch = [raw(op, b"{}") for op in ops[start : start + 10]]
        inbox.write(batch)
        if n % 5 == 0:
            assert {w.decision for w in inbox.write(batch)} == {Decision.REPLAY}
    (conflict,) = inbox.write([raw(ops[7], b'{"other": 1}')])
    assert conflict.decision is Decision.CONFLICT

    refused = {op for op in ops if int(op[3:]) % 50 == 0}
    eventually(
        lambda: states(db) == {"succeeded": 1200 - len(refused), "failed_terminal": len(refused)},
        "every row settled",
        DEADLINE,
    )
    settled_with_claims = sum(len(settled) for settled, _, _ in together.batches)
    assert settled_with_claims + sum(together.alone) == len(ops), "each settled once"
    refilled = [b for b in together.batches if b[1]]
    assert refilled, "some batch was written with a claim that took rows"
    times = {
        op: (settled, claimed)
        for op, settled, claimed in db.execute(
            "SELECT operation_id, settled_at, claimed_at FROM work_item"
        ).fetchall()
    }
    for settled, claimed, _ in together.batches:
        committed = {times[k.operation_id][0] for k in settled}
        assert len(committed) == 1, "a batch's rows settle in one transaction"
        assert {times[k.operation_id][1] for k in claimed} <= committed, (
            "the rows claimed with a batch were claimed in its transaction"
        )
    assert sorted(handler.ran) == ops
    assert db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall() == [(1, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [0, 8])
def test_the_rows_a_pool_holds_never_exceed_its_threads_through_a_lost_connection(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool], prefetch: int
) -> None:
    """Settlements commit with the claim that refills their slots, so the rows a pool of 8
    threads holds, sampled from another session all along, never number more than 8 and its
    prefetch (and with a prefetch, more than 8 at times: rows wait for a thread); not even when
    every connection of the pool is killed mid-drain. That fault costs the rows whose batch it
    cut their first claim (their runs report the outcome unknown) and nothing else: they come back
    once their short leases lapse and settle under fence 2. 1,500 rows, each batch of 100 sent
    twice, one conflicting redelivery, every 50th refused by its target."""
    handler = FailsEvery(50)
    registry = Registry()
    registry.register("quick", handler, lease=timedelta(seconds=2))
    ops = [f"op-{i:04d}" for i in range(1500)]
    for i in range(0, len(ops), 100):
        batch = [for_job(registry, "quick", op) for op in ops[i : i + 100]]
        store.inbox.ingest(batch)
        store.inbox.ingest(batch)  # replays
    (conflict,) = store.inbox.ingest([for_job(registry, "quick", ops[3], {"other": 1})])
    assert conflict.decision is Decision.CONFLICT

    events = Recorder()
    with HeldRows(db.info.dsn) as held:
        pools(registry, threads=8, prefetch=prefetch, events=events)
        eventually(lambda: len(events.of("settled")) >= 300, "a fifth of the rows settled")
        killed = db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        ).fetchall()
        assert killed, "the pool's connections were found and killed"
        refused = {op for op in ops if int(op[3:]) % 50 == 0}
        eventually(
            lambda: (
                states(db)
                == {"succeeded": len(ops) - len(refused), "failed_terminal": len(refused)}
            ),
            "every row settled",
            DEADLINE,
        )

    lost = {op for op, _, _ in events.of("settle_unknown")}
    assert lost, "the fault cut a batch"
    assert events.of("lease_lost") == []
    twice = db.execute("SELECT operation_id FROM work_item WHERE fence > 1").fetchall()
    assert {op for (op,) in twice} == lost, "only the rows of the batch cut ran again"
    abandoned = {(op, 1) for op in lost}
    most = held.most(besides=abandoned)
    assert len(held.samples) > 100, "the drain was sampled all along"
    assert most <= 8 + prefetch, f"the pool held {most} rows at once, 8 threads + {prefetch}"
    if prefetch:
        assert most > 8, "the prefetched rows waited beside the running ones"
    assert set(handler.ran) == set(ops)


class HeldOpen(ConditionalWriteHandler):
    """The first run waits (reporting progress, so its own lease is renewed) until the test
    opens the gate; the others succeed at once. Records what ran."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.ran: list[str] = []
        self.first_running = threading.Event()

    def handle(self, ctx: Context) -> None:
        self.ran.append(ctx.operation_id)
        if len(self.ran) == 1:
            self.first_running.set()
            while not self.gate.wait(0.02):
                ctx.progress()


def test_a_prefetched_row_whose_lease_ran_out_in_the_queue_is_given_back_unrun(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    """One thread and two rows prefetched behind a run that outlasts their leases: neither is
    run under its first claim (another worker may own the row by then); each is given back (or
    was taken over already by the next claim, as an expired lease is) and runs once, under its
    second fence."""
    handler = HeldOpen()
    registry = Registry()
    registry.register("slow", handler, lease=timedelta(seconds=1))
    store.inbox.ingest([for_job(registry, "slow", f"op-{i}") for i in range(3)])
    events = Recorder()
    pools(registry, threads=1, prefetch=2, events=events)
    handler.first_running.wait(DEADLINE)
    eventually(
        lambda: (
            db.execute(
                "SELECT count(*) FROM work_item"
                " WHERE state = 'claimed' AND lease_expires_at < now()"
            ).fetchone()
            == (2,)
        ),
        "the two waiting rows' leases to run out",
    )
    handler.gate.set()
    eventually(lambda: states(db) == {"succeeded": 3}, "every row settled", DEADLINE)
    assert sorted(handler.ran) == ["op-0", "op-1", "op-2"]  # each ran once
    fences = dict(db.execute("SELECT operation_id, fence FROM work_item").fetchall())
    first = handler.ran[0]
    assert fences == {op: 1 if op == first else 2 for op in ("op-0", "op-1", "op-2")}
    assert events.of("lease_lost") == []  # no run of a row it no longer owned


# -- progress heartbeats -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stuck_handler_loses_its_lease_while_a_slow_one_reporting_progress_keeps_it(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    lease = timedelta(seconds=2.5)
    stuck = StuckOnce()
    taken_over = threading.Event()

    class SlowButAlive(ConditionalWriteHandler):
        """Reports progress at every step; runs for three leases and past the takeover."""

        def handle(self, ctx: Context) -> Success:
            end = time.monotonic() + 3 * lease.total_seconds()
            while not (taken_over.is_set() and time.monotonic() >= end):
                ctx.progress()
                time.sleep(0.1)  # one step of work
            return Success("slow_done")

    registry = Registry()
    registry.register("stuck", stuck, lease=lease)
    registry.register("slow", SlowButAlive(), lease=lease)
    store.inbox.ingest([for_job(registry, "stuck", "stuck"), for_job(registry, "slow", "slow")])
    recorder = Recorder()

    pool = pools(registry, threads=4, events=recorder)
    eventually(lambda: row(db, "stuck")["state"] == "succeeded", "the stuck row is taken over")
    taken_over.set()
    eventually(lambda: row(db, "slow")["state"] == "succeeded", "the slow row completes")
    assert not stuck.returned.is_set()
    stuck.release.set()
    eventually(lambda: bool(recorder.of("lease_lost")), "the stuck handler's late settle")

    stuck_row, slow_row = row(db, "stuck"), row(db, "slow")
    assert (stuck_row["fence"], stuck_row["attempts"]) == (2, 2)
    assert stuck_row["outcome_code"] == "taken_over"
    assert (slow_row["fence"], slow_row["attempts"]) == (1, 1), "never lost its lease"
    assert slow_row["outcome_code"] == "slow_done"
    # The stuck one's late settle was refused by the fence.
    lost = recorder.of("lease_lost")
    assert [e for e in lost if e[0] == "stuck"] == [("stuck", 1, "complete")]
    # A renewal that overlaps the slow one's own completion is refused too (the row is settled
    # by then); completing under fence 1 above proves its lease was never lost before that.
    assert {e for e in lost if e[0] == "slow"} <= {("slow", 1, "heartbeat")}
    assert sorted(recorder.of("settled")) == [("slow", 1, "succeeded"), ("stuck", 2, "succeeded")]
    assert [e for e in recorder.of("claimed") if e[2] == "takeover"] == [("stuck", 2, "takeover")]
    assert pool.counts["takeover"] == 1


# -- stopping ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_graceful_stop_releases_unstarted_claims_and_abandons_what_outlives_the_deadline(
    store: PostgresStore, db: Db, pools: Callable[..., WorkerPool]
) -> None:
    blocked = StuckOnce()
    quick = Quick()
    registry = Registry()
    # Long enough that x cannot lapse (and be taken over) before stop() on a busy machine.
    registry.register("blocked", blocked, lease=timedelta(seconds=3))
    registry.register("quick", quick, lease=timedelta(seconds=1))
    reached_y = threading.Event()

    class HoldsY(Recorder):
        """Holds the claim of ``y`` between claim and hand-over until the pool is stopping."""

        def claimed(self, claim: Claim) -> None:
            super().claimed(claim)
            if claim.operation_id == "y":
                reached_y.set()
                # The pool's own stop flag: the one moment this test must observe.
                eventually(first._stopping.is_set, "stop() to begin")

    recorder = HoldsY()
    store.inbox.ingest([for_job(registry, "blocked", "x")])
    first = pools(registry, threads=2, events=recorder)
    assert blocked.started.wait(DEADLINE)
    store.inbox.ingest([for_job(registry, "quick", "y")])
    first.wake()
    assert reached_y.wait(DEADLINE)

    report = first.stop(deadline=1.0)

    # y was claimed but never started: back in the queue, the attempt not counted.
    y = row(db, "y")
    assert (y["state"], y["attempts"], y["fence"], y["lease_expires_at"]) == ("queued", 0, 1, None)
    assert quick.ran == []
    # x outlived the deadline: abandoned, told its lease is gone, nothing written for it.
    assert report.abandoned == 1
    x = row(db, "x")
    assert (x["state"], x["fence"], x["attempts"]) == ("claimed", 1, 1)
    assert x["lease_expires_at"] is not None
    assert first.counts.snapshot() == {"claimed": 2}

    # Once its lease lapses, the abandoned row belongs to whoever claims it next.
    eventually(lambda: lapsed(db, "x"), "x's lease to lapse")
    second = pools(registry, threads=2)
    eventually(lambda: states(db) == {"succeeded": 2}, "a new pool drains both rows")
    x = row(db, "x")
    assert (x["fence"], x["attempts"], x["outcome_code"]) == (2, 2, "taken_over")
    assert quick.ran == ["y"]
    assert row(db, "y")["attempts"] == 1

    # The abandoned handler finally returns: its settle carries fence 1 and is refused.
    blocked.release.set()
    eventually(lambda: first.counts["lease_lost"] == 1, "the abandoned handler's settle")
    assert row(db, "x")["outcome_code"] == "taken_over"
    assert "settled.succeeded" not in first.counts.snapshot()
    assert second.counts["settled.succeeded"] == 2


# -- the sweeper ---------------------------------------------------------------------------------


def test_one_sweeper_is_active_at_a_time_across_processes(db_url: str, db: Db) -> None:
    clock = Clock(datetime(2023, 1, 2, 3, 4, tzinfo=UTC))
    stores = [PostgresStore.connect(db_url, max_size=4, clock=clock) for _ in range(2)]
    try:
        a, b = (Sweeper(s.settle, interval=POLL) for s in stores)
        registry = Registry()
        registry.register("quick", Quick(), retry=RetryPolicy(max_attempts=1))
        ops = [f"op-{i}" for i in range(12)]
        stores[0].inbox.ingest([for_job(registry, "quick", op) for op in ops])
        claims = stores[0].claims.claim("crashed", len(ops), timedelta(seconds=5))
        assert len(claims) == len(ops)
        clock.advance(timedelta(seconds=10))  # every lease expired, no attempt left

        # Another sweeper is mid-round: it holds the sweep lock until its transaction ends.
        with psycopg.connect(db_url) as other, other.transaction():
            assert other.execute(sql.statement("sweep_lock")).fetchone() == (True,)
            assert (a.sweep_once(), b.sweep_once()) == ([], [])
            assert states(db) == {"claimed": len(ops)}

        for sweeper in (a, b):
            sweeper.start()
        try:
            eventually(lambda: states(db) == {"unknown": len(ops)}, "every row parked")
        finally:
            for sweeper in (a, b):
                sweeper.stop()
        parked = a.parked + b.parked
        assert sorted(parked, key=str) == sorted((Ticket("t1", op, 1) for op in ops), key=str), (
            "each row parked exactly once, by one sweeper"
        )
    finally:
        for s in stores:
            s.close()


def test_a_sweeper_remembers_only_its_most_recent_parked_rows(
    clocked: PostgresStore, clock: Clock
) -> None:
    registry = Registry()
    registry.register("quick", Quick(), retry=RetryPolicy(max_attempts=1))
    ops = [f"op-{i}" for i in range(120)]
    clocked.inbox.ingest([for_job(registry, "quick", op) for op in ops])
    assert len(clocked.claims.claim("crashed", len(ops), timedelta(seconds=5))) == len(ops)
    clock.advance(timedelta(seconds=10))

    sweeper = Sweeper(clocked.settle, keep=50)
    while sweeper.sweep_once():
        pass

    assert sweeper.parked_total == len(ops)
    assert len(sweeper.parked) == 50, "bounded, however many it parks"
    assert {t.operation_id for t in sweeper.parked} <= set(ops)


# -- stopping while a claim is still being written -----------------------------------------------


def test_claims_that_return_after_the_claimer_join_gave_up_are_released(
    store: PostgresStore, db_url: str, db: Db
) -> None:
    registry = Registry()
    quick = Quick()
    registry.register("quick", quick)
    ops = [f"late-{i}" for i in range(4)]
    store.inbox.ingest([for_job(registry, "quick", op) for op in ops])
    pool = WorkerPool(store, registry, HASHER, threads=4, poll_interval=POLL)
    with psycopg.connect(db_url) as locker:
        # The claim statement waits behind this lock until the pool has stopped.
        locker.execute("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
        pool.start()
        eventually(
            lambda: bool(
                db.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'fencebridge' AND wait_event_type = 'Lock'"
                ).fetchone()
            ),
            "the claim to wait for the lock",
        )
        report = pool.stop(deadline=0.2)
        assert pool.claimer.thread.is_alive(), "still inside its claim statement"
        locker.rollback()

    eventually(lambda: not pool.claimer.thread.is_alive(), "the claimer to finish")
    eventually(lambda: states(db) == {"queued": len(ops)}, "the late claims released")
    for op in ops:
        found = row(db, op)
        assert (found["attempts"], found["fence"], found["lease_expires_at"]) == (0, 1, None)
    assert quick.ran == []
    assert report.released == 0


# -- overlapped claiming -------------------------------------------------------------------------


class Gated(ConditionalWriteHandler):
    """Operations named ``gated-*`` wait for the gate; the others succeed at once."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def handle(self, ctx: Context) -> None:
        if ctx.operation_id.startswith("gated-"):
            assert self.gate.wait(DEADLINE), "the gate was never opened"


def test_two_claimers_have_their_settlement_writes_in_flight_at_once(
    store: PostgresStore,
    db: Db,
    pools: Callable[..., WorkerPool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first two settlement writes must meet inside the store at once, each in its
    claimer's transaction: one claimer alone could never pass the barrier, since it waits for
    its first write before it takes the next batch."""
    registry = Registry()
    gated = Gated()
    registry.register("gated", gated)
    ops = [f"fast-{i}" for i in range(4)] + [f"gated-{i}" for i in range(4)]
    ops += [f"later-{i}" for i in range(24)]
    store.inbox.ingest([for_job(registry, "gated", op) for op in ops])
    meeting = threading.Barrier(2, timeout=DEADLINE)
    met: list[int] = []
    calls = threading.Lock()
    settle_and_claim = store.claims.settle_and_claim

    def overlapping(*args: Any, **kwargs: Any) -> Any:
        with calls:
            first_two = len(met) < 2
            if first_two:
                met.append(len(met))
        if first_two:
            gated.gate.set()  # the other half of the workers can settle now
            meeting.wait()  # raises BrokenBarrierError unless another transaction comes
        return settle_and_claim(*args, **kwargs)

    monkeypatch.setattr(store.claims, "settle_and_claim", overlapping)
    events = Recorder()
    pools(registry, threads=8, claimers=2, claim_batch=8, events=events)

    eventually(lambda: states(db) == {"succeeded": len(ops)}, "every row settled", DEADLINE)
    assert met == [0, 1]
    assert not meeting.broken, "two settlement writes were in flight at once"
    fences = db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall()
    assert fences == [(1, 1)], "every row claimed once and settled under that fence"
    assert events.of("lease_lost") == []
    assert events.of("settle_unknown") == []
    assert sorted(op for op, _, _ in events.of("settled")) == sorted(ops)


class ThreadsOf(Recorder):
    """A recorder that also notes which worker thread settled each operation, and raises out of
    the first settlement it hears of, as a broken events receiver would."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, str] = {}
        self.raised: list[str] = []

    def settled(self, claim: Claim, state: State, code: str) -> None:
        super().settled(claim, state, code)
        with self._lock:
            self.threads[claim.operation_id] = threading.current_thread().name
            if not self.raised:
                self.raised.append(claim.operation_id)
                raise RuntimeError("a broken events receiver")


@pytest.mark.slow
@pytest.mark.parametrize(("claim_batch", "per_statement"), [(None, 16), (5, 5)])
def test_a_claim_round_refills_the_workers_in_statements_of_claim_batch_rows(  # noqa: PLR0917  (fixtures and parameters)
    store: PostgresStore,
    db: Db,
    pools: Callable[..., WorkerPool],
    monkeypatch: pytest.MonkeyPatch,
    claim_batch: int | None,
    per_statement: int,
) -> None:
    """The rows a settlement batch frees are claimed in statements of at most ``claim_batch``
    rows, one after another until the round has its rows or a statement comes back short;
    unset, it is the thread count, so one statement refills every worker. 1,200 rows, each
    claimed once and settled under that fence."""
    registry = Registry()
    registry.register("quick", Quick())
    ops = [f"op-{i:04d}" for i in range(1200)]
    for i in range(0, len(ops), 200):
        store.inbox.ingest([for_job(registry, "quick", op) for op in ops[i : i + 200]])
    statements: list[int] = []  # rows asked by each claim statement of the current round
    rounds: list[tuple[int, list[int]]] = []  # (rows wanted, each statement's rows)
    claim, settle_and_claim = store.claims.claim, store.claims.settle_and_claim

    def counting(worker: str, limit: int, *args: Any, **kwargs: Any) -> Any:
        statements.append(limit)
        return claim(worker, limit, *args, **kwargs)

    def counting_with(settlements: Any, worker: str, lease: Any, **kwargs: Any) -> Any:
        statements.append(kwargs["limit"])  # the first statement of a round that settles
        return settle_and_claim(settlements, worker, lease, **kwargs)

    monkeypatch.setattr(store.claims, "claim", counting)
    monkeypatch.setattr(store.claims, "settle_and_claim", counting_with)
    pool = pools(registry, threads=16, claim_batch=claim_batch)
    claim_rows = pool._claim_rows

    def recording(want: int, handoff: Any, *args: Any) -> Any:
        statements.clear()  # one claimer: the rounds come one at a time
        got = claim_rows(want, handoff, *args)
        rounds.append((want, list(statements)))
        return got

    monkeypatch.setattr(pool, "_claim_rows", recording)

    eventually(lambda: states(db) == {"succeeded": len(ops)}, "every row settled", DEADLINE)
    fences = db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall()
    assert fences == [(1, 1)], "every row claimed once and settled under that fence"
    full = 0
    for want, each in rounds:
        planned = [min(per_statement, want - k) for k in range(0, want, per_statement)]
        assert each == planned[: len(each)]
        full += each == planned and len(planned) == -(-16 // per_statement)
    assert full, "some round refilled all sixteen workers, in statements of claim_batch rows"


@pytest.mark.slow
def test_runs_end_at_their_handover_and_a_reaction_that_raises_in_the_writer_stops_nothing(
    store: PostgresStore,
    db: Db,
    pools: Callable[..., WorkerPool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run hands its settlement over and its thread goes on; the answer's events are
    reported by the claimer that wrote the batch. An events receiver that raises there (on the
    first settlement it hears of) is logged by type and stops neither the claimer nor the other
    answers: 1,200 rows, every one run once and settled under its first fence, the claimer
    never restarted, and every thread ran some."""
    registry = Registry()
    quick = Quick()
    registry.register("quick", quick)
    ops = [f"op-{i:04d}" for i in range(1200)]
    for i in range(0, len(ops), 200):
        store.inbox.ingest([for_job(registry, "quick", op) for op in ops[i : i + 200]])
    events = ThreadsOf()
    ran_on: dict[str, str] = {}
    original = quick.handle

    def noting(ctx: Context) -> None:
        ran_on[ctx.operation_id] = threading.current_thread().name
        original(ctx)

    quick.handle = noting  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="bridge.runtime.worker"):
        pool = pools(registry, threads=8, events=events)
        eventually(lambda: states(db) == {"succeeded": len(ops)}, "every row settled", DEADLINE)
    assert sorted(quick.ran) == ops  # each ran once
    assert db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall() == [(1, 1)]
    assert len(events.raised) == 1
    assert pool.claimer.status().restarts == 0
    assert "RuntimeError" in caplog.text
    # The answers were reported by the claimer, the runs were spread over every thread.
    assert set(events.threads.values()) == {"fencebridge-claimer"}
    assert len(set(ran_on.values())) == 8


# -- replicas: processes beside threads ----------------------------------------------------------


class Busy(ConditionalWriteHandler):
    """Holds the GIL for a while: a CPU-bound handler, as one process's threads would share."""

    def handle(self, ctx: Context) -> None:
        total = 0
        for i in range(20_000):
            total += i * i
        assert total > 0


def replica(url: str, expected: int, ran: Any) -> None:
    """One replica in a process of its own: a pool that drains until every row settled."""
    store = PostgresStore.connect(url, max_size=12)
    try:
        registry = Registry()
        registry.register("busy", Busy())
        pool = WorkerPool(store, registry, HASHER, threads=4, poll_interval=POLL)
        pool.start()
        with psycopg.connect(url, autocommit=True) as conn:
            eventually(lambda: states(conn).get("succeeded", 0) == expected, "every row settled")
        pool.stop(deadline=10)
        ran.value = pool.counts["settled.succeeded"]
    finally:
        store.close()


@pytest.mark.slow
def test_replicas_in_processes_of_their_own_share_the_work_and_run_each_row_once(
    store: PostgresStore, db_url: str, db: Db
) -> None:
    """The shape for CPU-bound handlers: several processes (replicas), each with its own pool."""
    import multiprocessing  # noqa: PLC0415  (only this test starts processes)

    registry = Registry()
    registry.register("busy", Busy())
    ops = [f"busy-{i}" for i in range(400)]
    store.inbox.ingest([for_job(registry, "busy", op) for op in ops])
    spawn = multiprocessing.get_context("spawn")
    counts = [spawn.Value("l", 0) for _ in range(2)]
    children = [spawn.Process(target=replica, args=(db_url, len(ops), ran)) for ran in counts]
    for child in children:
        child.start()
    for child in children:
        child.join(DEADLINE * 2)
    assert [child.exitcode for child in children] == [0, 0]
    assert states(db) == {"succeeded": len(ops)}
    assert db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall() == [(1, 1)]
    ran = [c.value for c in counts]
    assert sum(ran) == len(ops), "each row ran once, in one replica"
    assert all(n > 0 for n in ran), f"both replicas took work: {ran}"
