"""Everything bounded in time: session limits on every pooled connection, class A deadlines.

Real PostgreSQL, real locks held by another session, real worker pools with their heartbeater.
Nothing here asserts how long anything took: a test waits (with a generous deadline) for the
state a bound must bring about, such as a row lock released while its holder is still stuck.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.database import Connection, SessionTimeouts
from bridge.demo import invoices
from bridge.errors import DeadlineExceeded, StoreUnavailable
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import Context, RetryPolicy, SameDatabaseHandler, Success
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.types import Key
from tests.support.deliveries import for_job
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"time-bound-tests-identity-secret")
TENANT = "t1"
#: retries come due at once, so a test sees the next attempt without waiting for backoff
QUICK_RETRY = RetryPolicy(
    max_attempts=50,
    backoff_initial=timedelta(milliseconds=20),
    backoff_max=timedelta(milliseconds=100),
)


def row(db: Db, operation: str) -> dict[str, Any]:
    cur = db.execute(
        "SELECT state, fence, attempts, outcome_code, outcome_detail"
        "  FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (TENANT, operation),
    )
    found = cur.fetchone()
    assert found is not None
    return dict(zip([c.name for c in cur.description or ()], found, strict=True))


@pytest.fixture
def bounded(db_url: str) -> Iterator[Callable[[SessionTimeouts], PostgresStore]]:
    opened: list[PostgresStore] = []

    def open_store(timeouts: SessionTimeouts) -> PostgresStore:
        store = PostgresStore.connect(db_url, max_size=4, timeouts=timeouts)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def pools(store: PostgresStore) -> Iterator[Callable[[Registry], WorkerPool]]:
    started: list[WorkerPool] = []

    def start(registry: Registry) -> WorkerPool:
        pool = WorkerPool(store, registry, HASHER, threads=2, poll_interval=0.05)
        started.append(pool)
        pool.start()
        return pool

    yield start
    for pool in started:
        pool.stop(deadline=10)


@pytest.fixture
def locker(db_url: str) -> Iterator[Db]:
    """Another session, as another application would hold locks on the bridge's rows."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def setting(store: PostgresStore, name: str) -> str:
    with store.pool.connection() as conn:
        found = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert found is not None
    return str(found[0])


# -- session limits ------------------------------------------------------------------------------


def test_pooled_connections_start_with_the_limits_given_or_the_defaults(
    bounded: Callable[[SessionTimeouts], PostgresStore],
) -> None:
    given = bounded(
        SessionTimeouts(
            statement=timedelta(seconds=2),
            lock=timedelta(milliseconds=1500),
            idle_in_transaction=timedelta(seconds=3),
        )
    )
    assert [
        setting(given, n)
        for n in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    ] == ["2s", "1500ms", "3s"]
    default = bounded(SessionTimeouts())
    assert [
        setting(default, n)
        for n in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    ] == ["30s", "10s", "1min"]


def test_a_statement_past_statement_timeout_is_a_clear_error_and_applies_nothing(
    bounded: Callable[[SessionTimeouts], PostgresStore], locker: Db, db: Db
) -> None:
    store = bounded(SessionTimeouts(statement=timedelta(milliseconds=300), lock=None))
    registry = Registry()
    registry.register("job", invoices.RefundInvoice())
    store.inbox.ingest([for_job(registry, "job", "op-1")])
    with locker.transaction():
        locker.execute("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailable, match="ran past statement_timeout") as raised:
            store.claims.claim("w", 1, timedelta(seconds=30))
    assert raised.value.outcome_unknown is False
    assert row(db, "op-1")["state"] == "queued", "the cancelled claim changed nothing"
    assert len(store.claims.claim("w", 1, timedelta(seconds=30))) == 1, "the pool is usable again"


def test_a_lock_wait_past_lock_timeout_is_a_clear_error_and_applies_nothing(
    bounded: Callable[[SessionTimeouts], PostgresStore], locker: Db, db: Db
) -> None:
    store = bounded(SessionTimeouts(statement=None, lock=timedelta(milliseconds=300)))
    registry = Registry()
    registry.register("job", invoices.RefundInvoice())
    store.inbox.ingest([for_job(registry, "job", "op-1")])
    with locker.transaction():
        locker.execute("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailable, match="not granted within lock_timeout") as raised:
            store.claims.claim("w", 1, timedelta(seconds=30))
    assert raised.value.outcome_unknown is False
    assert row(db, "op-1")["state"] == "queued"


def test_a_transaction_left_idle_is_ended_by_the_server_and_its_locks_released(
    bounded: Callable[[SessionTimeouts], PostgresStore], locker: Db
) -> None:
    store = bounded(SessionTimeouts(idle_in_transaction=timedelta(milliseconds=300)))
    locker.execute("CREATE TABLE held (id int PRIMARY KEY)")
    locker.execute("INSERT INTO held VALUES (1)")
    with store.pool.connection() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE")
        pid = conn.info.backend_pid

        def gone() -> bool:
            found = locker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            return found == (0,)

        eventually(gone, "the idle transaction's session ended by the server")
        # The row it locked is free for everyone else.
        assert locker.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE NOWAIT").fetchall()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 1")
    # The broken connection was not handed out again.
    with store.pool.connection() as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


# -- class A: the deadline, not the lease, ends a run that holds its row -------------------------


class ProgressingRefund(invoices.RefundInvoice):
    """Refunds, then works for ``seconds`` reporting progress every step, then commits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.errors: list[BaseException] = []
        self.runs = 0

    def handle(self, ctx: Context, tx: Connection) -> Success:
        self.runs += 1
        done = super().handle(ctx, tx)
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            try:
                ctx.progress()
            except BaseException as exc:
                self.errors.append(exc)
                raise
            time.sleep(0.1)  # one step of work
        return done


@pytest.mark.slow
def test_class_a_handler_reporting_progress_past_its_lease_commits_once(
    store: PostgresStore, db: Db, pools: Callable[[Registry], WorkerPool]
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, TENANT, "inv-1", amount=1200)
    handler = ProgressingRefund(seconds=6.0)  # two leases of 3 s
    registry = Registry()
    registry.register("refund", handler, lease=timedelta(seconds=3))
    store.inbox.ingest([for_job(registry, "refund", "refund-1", {"invoice_id": "inv-1"})])

    pool = pools(registry)
    eventually(lambda: row(db, "refund-1")["state"] != "claimed" and handler.runs > 0, "settled")
    pool.stop(deadline=10)

    assert handler.errors == []
    assert handler.runs == 1
    settled = row(db, "refund-1")
    assert (settled["state"], settled["attempts"], settled["fence"]) == ("succeeded", 1, 1)
    found = invoices.find_invoice(db, TENANT, "inv-1")
    assert found is not None
    assert (found.status, found.refunded_fence) == ("refunded", 1)
    assert pool.counts.snapshot() == {"claimed": 1, "settled.succeeded": 1}


class BoundedRefund(invoices.RefundInvoice):
    """The demo refund under a short deadline; counts its runs."""

    deadline = timedelta(seconds=1)

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def handle(self, ctx: Context, tx: Connection) -> Success:
        self.attempts.append(ctx.attempt)
        return super().handle(ctx, tx)


@pytest.mark.slow
def test_class_a_handler_blocked_on_a_business_row_lock_is_rolled_back_and_retried(
    store: PostgresStore, db: Db, locker: Db, pools: Callable[[Registry], WorkerPool]
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, TENANT, "inv-1", amount=1200)
    handler = BoundedRefund()
    registry = Registry()
    registry.register("refund", handler, retry=QUICK_RETRY, lease=timedelta(seconds=60))
    store.inbox.ingest([for_job(registry, "refund", "refund-1", {"invoice_id": "inv-1"})])

    with locker.transaction():
        # Another application holds the invoice row.
        locker.execute("SELECT * FROM demo_invoice WHERE invoice_id = 'inv-1' FOR UPDATE")
        pool = pools(registry)
        eventually(lambda: len(handler.attempts) >= 3, "three attempts, each cut at its deadline")
        retried = row(db, "refund-1")
        # While it waits for the lock, the work row is not held by a stuck transaction: the
        # attempts before were rolled back and put back in the queue, each under its own fence.
        assert retried["outcome_code"] in ("deadline_exceeded", None)
        assert retried["state"] in ("queued", "claimed")
    eventually(lambda: row(db, "refund-1")["state"] == "succeeded", "succeeded once unlocked")
    pool.stop(deadline=10)

    done = row(db, "refund-1")
    assert done["attempts"] == len(handler.attempts) >= 3
    found = invoices.find_invoice(db, TENANT, "inv-1")
    assert found is not None
    assert (found.status, found.refunded_fence) == ("refunded", done["fence"])
    counts = pool.counts.snapshot()
    assert counts["settled.succeeded"] == 1
    assert counts["settled.queued"] == done["attempts"] - 1
    assert "settled.unknown" not in counts


class HungRefund(invoices.RefundInvoice):
    """Refunds, then hangs outside the database on its first attempt until released."""

    deadline = timedelta(seconds=1)

    def __init__(self) -> None:
        self.hung = threading.Event()
        self.release = threading.Event()
        self.attempts: list[int] = []

    def handle(self, ctx: Context, tx: Connection) -> Success:
        self.attempts.append(ctx.attempt)
        done = super().handle(ctx, tx)
        if ctx.attempt == 1:
            self.hung.set()
            self.release.wait(90)  # a call that does not answer
        return done


def test_class_a_handler_hung_in_a_call_loses_its_transaction_and_the_work_is_retried(
    store: PostgresStore, db: Db, locker: Db, pools: Callable[[Registry], WorkerPool]
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, TENANT, "inv-1", amount=1200)
    handler = HungRefund()
    registry = Registry()
    registry.register("refund", handler, retry=QUICK_RETRY, lease=timedelta(seconds=60))
    store.inbox.ingest([for_job(registry, "refund", "refund-1", {"invoice_id": "inv-1"})])
    pool = pools(registry)
    assert handler.hung.wait(60)

    def row_free() -> bool:
        try:
            with locker.transaction():
                locker.execute(
                    "SELECT 1 FROM work_item WHERE operation_id = 'refund-1' FOR UPDATE NOWAIT"
                )
                locker.execute(
                    "SELECT 1 FROM demo_invoice WHERE invoice_id = 'inv-1' FOR UPDATE NOWAIT"
                )
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    # Still hung, yet the server ended its transaction: the rows are free, the refund undone.
    eventually(row_free, "the hung handler's rows released")
    assert not handler.release.is_set()
    found = invoices.find_invoice(db, TENANT, "inv-1")
    assert found is not None
    assert found.status == "paid"

    handler.release.set()
    eventually(lambda: row(db, "refund-1")["state"] == "succeeded", "the retry succeeded")
    pool.stop(deadline=10)
    done = row(db, "refund-1")
    assert handler.attempts == [1, 2]
    assert (done["attempts"], done["fence"]) == (2, 2)
    found = invoices.find_invoice(db, TENANT, "inv-1")
    assert found is not None
    assert (found.status, found.refunded_fence) == ("refunded", 2)
    assert "settled.unknown" not in pool.counts.snapshot()


class SlowPastDeadline(SameDatabaseHandler):
    """Writes, then keeps working past its deadline without touching the database."""

    deadline = timedelta(milliseconds=300)

    def __init__(self) -> None:
        self.progress_errors: list[BaseException] = []

    def handle(self, ctx: Context, tx: Connection) -> Success:
        tx.execute("INSERT INTO deadline_effect VALUES (%s)", (ctx.fence,))
        ctx.lease_lost.set()  # as the heartbeater or a stop would: no lease reason may stop it
        ctx.progress()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            time.sleep(0.05)
        try:
            ctx.progress()
        except DeadlineExceeded as exc:
            self.progress_errors.append(exc)
        return Success("late")


@pytest.mark.slow
def test_class_a_past_its_deadline_is_rolled_back_and_never_unknown_even_on_the_last_attempt(
    store: PostgresStore, db: Db
) -> None:
    db.execute("CREATE TABLE deadline_effect (fence bigint)")
    handler = SlowPastDeadline()
    registry = Registry()
    registry.register("slow", handler, retry=RetryPolicy(max_attempts=2))
    store.inbox.ingest([for_job(registry, "slow", "op-1")])
    spec = registry["slow"]

    outcomes = []
    for _ in range(2):
        (claim,) = store.claims.claim_keys("w", [Key(TENANT, "op-1")], timedelta(seconds=30))
        events = EventCounter()
        execute(Run(store.settle, claim, spec, Context.for_claim(claim, HASHER), events))
        outcomes.append((events.snapshot(), row(db, "op-1")["state"]))
        db.execute("UPDATE work_item SET next_attempt_at = now() WHERE operation_id = 'op-1'")

    assert outcomes == [
        ({"settled.queued": 1}, "queued"),
        ({"settled.failed_terminal": 1}, "failed_terminal"),
    ]
    last = row(db, "op-1")
    assert last["outcome_code"] == "attempts_exhausted"
    assert db.execute("SELECT count(*) FROM deadline_effect").fetchone() == (0,)
    assert len(handler.progress_errors) == 2, "progress() said the deadline passed, each time"
