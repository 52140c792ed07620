"""Batched settlement on real PostgreSQL: many runs' fenced settlements in one write.

What batching must not change: each row moves only under its own current fence; a stale ticket
in a batch is refused alone and reported to its own run as a lost lease, while the rest of the
batch commits; a batch that fails as a whole fails every run in it; class A never goes through
it. The store's clock is injected, so leases expire without sleeping; tests wait on events and
the completer's own pending count, never on time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge.database import APPLICATION_NAME, Connection, SessionTimeouts, open_pool
from bridge.errors import LeaseLost, StoreUnavailable
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.completer import BatchCompleter
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, SameDatabaseHandler, TerminalFailure
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import Database, PostgresStore, SettledClaim, Settlement
from bridge.store.claims import ClaimPolicy, ClaimStore
from bridge.store.settle import SettleStore
from bridge.types import Claim, Delivery, State, TargetClass, Ticket
from tests.support.clock import Clock
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"batch-settlement-tests-identity-secret")
START = datetime(2024, 3, 4, 5, 6, tzinfo=UTC)
SHORT, LONG = timedelta(seconds=10), timedelta(hours=1)
DEADLINE = 60.0


@pytest.fixture
def clocked(store: PostgresStore) -> tuple[PostgresStore, Clock]:
    clock = Clock(START)
    return PostgresStore(store.pool, clock=clock), clock


def deliveries(
    operations: Sequence[str], job: str = "job", target: TargetClass = TargetClass.B
) -> list[Delivery]:
    return [
        Delivery(
            tenant_id="t1",
            operation_id=op,
            subscription="batch",
            job_type=job,
            target_class=target,
            payload=json.dumps({"op": op}).encode(),
        )
        for op in operations
    ]


def state_of(db: Db, operation: str) -> tuple[str, int, str | None]:
    found = db.execute(
        "SELECT state, fence, outcome_code FROM work_item WHERE operation_id = %s", (operation,)
    ).fetchone()
    assert found is not None
    return found[0], int(found[1]), found[2]


def one_stale_among(
    store: PostgresStore, clock: Clock, fresh: Sequence[str]
) -> tuple[Claim, list[Claim]]:
    """Claim ``stale`` and the ``fresh`` rows; let ``stale``'s lease lapse and take it over.

    Returns the first claim of ``stale`` (its fence is no longer current) and the current
    claims of the fresh rows.
    """
    store.inbox.ingest(deliveries(["stale", *fresh]))
    (first,) = store.claims.claim("w1", 1, SHORT)
    assert first.operation_id == "stale"
    others = store.claims.claim("w1", len(fresh), LONG)
    clock.advance(SHORT * 2)
    (newer,) = store.claims.claim("w2", 1, SHORT)
    assert (newer.operation_id, newer.fence) == ("stale", first.fence + 1)
    return first, others


def settle_in_threads(
    completer: BatchCompleter, settlements: Sequence[Settlement]
) -> tuple[list[threading.Thread], dict[str, BaseException | None]]:
    """One thread per settlement, each blocked in ``completer.settle`` until answered."""
    answers: dict[str, BaseException | None] = {}

    def run(s: Settlement) -> None:
        try:
            completer.settle(s)
        except BaseException as exc:  # noqa: BLE001  (the answer under test)
            answers[s.ticket.operation_id] = exc
        else:
            answers[s.ticket.operation_id] = None

    threads = [threading.Thread(target=run, args=(s,)) for s in settlements]
    for t in threads:
        t.start()
    eventually(lambda: completer.pending == len(settlements), "every settlement to be pending")
    return threads, answers


def test_a_batch_refuses_only_its_stale_ticket_and_commits_the_rest(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    store, clock = clocked
    stale_claim, fresh = one_stale_among(store, clock, ["a", "b", "c"])
    stale = stale_claim.ticket
    completer = BatchCompleter(store.settle)
    settlements = [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in [*fresh, stale_claim]]
    threads, answers = settle_in_threads(completer, settlements)

    batch = completer.take()
    assert batch is not None
    assert len(batch) == 4
    batch.write(store.settle)
    for t in threads:
        t.join(DEADLINE)

    lost = answers["stale"]
    assert isinstance(lost, LeaseLost)
    assert (lost.operation_id, lost.fence) == ("stale", stale.fence)
    assert {op: answers[op] for op in "abc"} == {"a": None, "b": None, "c": None}
    assert [state_of(db, op)[0] for op in "abc"] == ["succeeded"] * 3
    # The newer claim still owns the row: the stale settlement moved nothing.
    assert state_of(db, "stale") == ("claimed", stale.fence + 1, None)
    assert completer.pending == 0


#: sessions of the store waiting for a row lock
#: sessions of this test's database waiting on a lock: the suite runs on several workers
#: against one server, and another test's waits must neither pass nor spoil the check
LOCK_WAITS = """
SELECT count(*) FROM pg_stat_activity
 WHERE application_name = %s AND wait_event_type = 'Lock' AND datname = current_database()
"""


def test_a_batch_behind_a_concurrent_write_is_judged_on_the_row_that_write_left(
    store: PostgresStore, db_url: str, db: Db
) -> None:
    """A settlement that waits on rows another transaction holds (a heartbeat extending one
    lease, a takeover raising the other row's fence) tests each row's fence and state again as
    that transaction left it: the heartbeat's row settles, the taken row is refused. A
    settlement that updated the row version it first found refused both."""
    store.inbox.ingest(deliveries(["beat", "taken"]))
    claims = {c.operation_id: c for c in store.claims.claim("w1", 2, LONG)}
    assert set(claims) == {"beat", "taken"}
    settled: list[list[Ticket]] = []
    with psycopg.connect(db_url) as other:
        other.execute(
            "UPDATE work_item SET lease_expires_at = lease_expires_at + interval '1 minute'"
            " WHERE operation_id = 'beat'"
        )
        other.execute(
            "UPDATE work_item SET fence = fence + 1, lease_owner = 'w2'"
            " WHERE operation_id = 'taken'"
        )
        writer = threading.Thread(
            target=lambda: settled.append(
                store.settle.settle_many(
                    [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claims.values()]
                )
            )
        )
        writer.start()
        eventually(
            lambda: db.execute(LOCK_WAITS, (APPLICATION_NAME,)).fetchone() == (1,),
            "the settlement to wait for the other transaction's row locks",
        )
        other.commit()
    writer.join(DEADLINE)
    assert settled == [[claims["taken"].ticket]]
    assert state_of(db, "beat") == ("succeeded", claims["beat"].fence, "ok")
    assert state_of(db, "taken") == ("claimed", claims["taken"].fence + 1, None)


def test_a_batch_settled_for_a_writer_with_more_to_do_waits_for_its_answer(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    """``Batch.settle`` commits and returns the stale tickets, but no run goes on until the
    writer answers (the pool first hands the runs the rows it claimed meanwhile)."""
    store, clock = clocked
    stale_claim, fresh = one_stale_among(store, clock, ["a", "b"])
    completer = BatchCompleter(store.settle)
    settlements = [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in [*fresh, stale_claim]]
    threads, answers = settle_in_threads(completer, settlements)
    batch = completer.take()
    assert batch is not None

    stale = batch.settle(store.settle)

    assert stale == [stale_claim.ticket]
    assert [state_of(db, op)[0] for op in "ab"] == ["succeeded"] * 2
    assert all(t.is_alive() for t in threads), "a run went on before it was answered"
    assert answers == {}
    batch.answer(stale)
    for t in threads:
        t.join(DEADLINE)
    assert isinstance(answers["stale"], LeaseLost)
    assert (answers["a"], answers["b"]) == (None, None)


def test_a_batch_whose_write_fails_gives_every_run_the_error() -> None:
    # Nothing listens on port 1: the pool cannot hand out a connection.
    unreachable = PostgresStore(open_pool("postgresql://postgres@127.0.0.1:1/none", timeout=0.5))
    try:
        completer = BatchCompleter(unreachable.settle)
        settlements = [
            Settlement(Ticket("t1", op, 1), State.SUCCEEDED, "ok") for op in ("a", "b", "c")
        ]
        threads, answers = settle_in_threads(completer, settlements)
        batch = completer.take()
        assert batch is not None
        with pytest.raises(StoreUnavailable):
            batch.write(unreachable.settle)
        for t in threads:
            t.join(DEADLINE)
    finally:
        unreachable.close()
    assert set(answers) == {"a", "b", "c"}
    assert all(isinstance(e, StoreUnavailable) for e in answers.values())


def test_a_closed_completer_writes_each_settlement_alone_under_its_fence(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    store, clock = clocked
    stale, (fresh,) = one_stale_among(store, clock, ["a"])
    completer = BatchCompleter(store.settle)
    completer.close()

    completer.settle(Settlement(fresh.ticket, State.SUCCEEDED, "ok"))  # no writer: at once
    with pytest.raises(LeaseLost):
        completer.settle(Settlement(stale.ticket, State.SUCCEEDED, "ok"))

    assert state_of(db, "a")[0] == "succeeded"
    assert state_of(db, "stale") == ("claimed", stale.fence + 1, None)


def test_closing_writes_what_is_pending_and_marks_those_runs_taken(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    store, _ = clocked
    store.inbox.ingest(deliveries(["a", "b"]))
    claims = store.claims.claim("w1", 2, LONG)
    completer = BatchCompleter(store.settle)
    runs = [completer.for_run() for _ in claims]
    threads = [
        threading.Thread(target=r.settle, args=(Settlement(c.ticket, State.SUCCEEDED, "ok"),))
        for r, c in zip(runs, claims, strict=True)
    ]
    for t in threads:
        t.start()
    eventually(lambda: completer.pending == 2, "both settlements to be pending")

    completer.close()
    for t in threads:
        t.join(DEADLINE)

    assert all(r.taken for r in runs)
    assert [state_of(db, op)[0] for op in "ab"] == ["succeeded", "succeeded"]


def test_handed_over_settlements_are_answered_by_their_writer_and_one_bad_reaction_stops_none(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    """settle_later returns at once; the writer of the batch calls every reaction with its own
    answer (the stale ticket's is LeaseLost), a reaction that raises included; once the
    completer is closed, a settlement handed over is written at once, in the caller's thread."""
    store, clock = clocked
    stale, fresh = one_stale_among(store, clock, ["a", "b"])
    completer = BatchCompleter(store.settle)
    answers: dict[str, tuple[str | None, str]] = {}

    def reaction(op: str, *, broken: bool = False) -> Any:
        def answered(error: BaseException | None) -> None:
            answers[op] = (type(error).__name__ if error else None, threading.current_thread().name)
            if broken:
                raise RuntimeError("a broken reaction")

        return answered

    runs = [completer.for_run() for _ in range(3)]
    for run, claim in zip(runs, [*fresh, stale], strict=True):
        settlement = Settlement(claim.ticket, State.SUCCEEDED, "ok")
        run.settle_later(settlement, reaction(claim.operation_id, broken=claim is fresh[0]))
    assert answers == {}  # nothing written yet: every call returned at once
    assert completer.pending == 3
    writer = threading.Thread(target=lambda: completer.take().write(store.settle), name="writer")  # type: ignore[union-attr]
    writer.start()
    writer.join(DEADLINE)

    assert answers == {
        "a": (None, "writer"),
        "b": (None, "writer"),
        "stale": ("LeaseLost", "writer"),
    }
    assert all(run.taken and run.submitted for run in runs)
    assert [state_of(db, op)[0] for op in "ab"] == ["succeeded", "succeeded"]
    assert state_of(db, "stale") == ("claimed", stale.fence + 1, None)

    store.inbox.ingest(deliveries(["late"]))
    (late,) = store.claims.claim("w1", 1, LONG)
    completer.close()
    completer.settle_later(Settlement(late.ticket, State.SUCCEEDED, "ok"), None, reaction("late"))
    assert answers["late"] == (None, threading.current_thread().name)
    assert state_of(db, "late")[0] == "succeeded"


# -- through the executors and the pool ---------------------------------------------------------


class Noop(ConditionalWriteHandler):
    def handle(self, ctx: Context) -> None:
        return None


def test_executor_settlements_in_one_batch_are_answered_per_claim(
    clocked: tuple[PostgresStore, Clock],
) -> None:
    store, clock = clocked
    registry = Registry()
    spec = registry.register("job", Noop())
    stale, fresh = one_stale_among(store, clock, ["a", "b"])
    completer = BatchCompleter(store.settle)
    events: dict[str, EventCounter] = {}

    def run(claim: Claim) -> None:
        events[claim.operation_id] = counter = EventCounter()
        ctx = Context.for_claim(claim, HASHER)
        execute(Run(store.settle, claim, spec, ctx, counter, completer.for_run()))

    threads = [threading.Thread(target=run, args=(c,)) for c in [*fresh, stale]]
    for t in threads:
        t.start()
    eventually(lambda: completer.pending == 3, "every run to be settling")
    batch = completer.take()
    assert batch is not None
    batch.write(store.settle)
    for t in threads:
        t.join(DEADLINE)

    assert events["a"].snapshot() == {"settled.succeeded": 1}
    assert events["b"].snapshot() == {"settled.succeeded": 1}
    assert events["stale"].snapshot() == {"lease_lost": 1}


class Recording(PostgresStore):
    """The real store, noting which tickets went out in a batched write."""

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store.pool)
        self._lock = threading.Lock()
        self.batched: set[str] = set()
        self.settle = RecordingSettle(self, self._note)
        self.claims = RecordingClaims(self, self.claims.policy, self.settle, self._note)

    def _note(self, settlements: Sequence[Settlement]) -> None:
        with self._lock:
            self.batched.update(s.ticket.operation_id for s in settlements)


class RecordingSettle(SettleStore):
    def __init__(self, db: Database, note: Callable[[Sequence[Settlement]], None]) -> None:
        super().__init__(db)
        self._note = note

    def settle_many(self, settlements: Sequence[Settlement]) -> list[Ticket]:
        self._note(settlements)
        return super().settle_many(settlements)


class RecordingClaims(ClaimStore):
    def __init__(
        self,
        db: Database,
        policy: ClaimPolicy,
        settle: SettleStore,
        note: Callable[[Sequence[Settlement]], None],
    ) -> None:
        super().__init__(db, policy, settle)
        self._note = note

    def settle_and_claim(
        self, settlements: Sequence[Settlement], *args: Any, **kwargs: Any
    ) -> SettledClaim:
        self._note(settlements)
        return super().settle_and_claim(settlements, *args, **kwargs)


class Refuses(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> None:
        raise TerminalFailure("refused")


@pytest.fixture
def recording(store: PostgresStore) -> Recording:
    return Recording(store)


def test_the_pool_batches_final_settlements_but_never_class_a(recording: Recording, db: Db) -> None:
    registry = Registry()
    registry.register("b", Noop())
    registry.register("a", Refuses())
    b_ops = [f"b{i}" for i in range(30)]
    a_ops = [f"a{i}" for i in range(6)]
    recording.inbox.ingest([*deliveries(b_ops, "b"), *deliveries(a_ops, "a", TargetClass.A)])
    pool = WorkerPool(recording, registry, HASHER, threads=4, poll_interval=0.05)
    pool.start()
    try:
        eventually(
            lambda: (
                pool.counts["settled.succeeded"] == 30
                and pool.counts["settled.failed_terminal"] == 6
            ),
            "every row to settle",
        )
    finally:
        pool.stop()

    assert set(b_ops) <= recording.batched
    assert not set(a_ops) & recording.batched
    assert pool.counts["lease_lost"] == 0
    counts = dict(db.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall())
    assert counts == {"succeeded": 30, "failed_terminal": 6}


# -- settlements written with the claim that follows them ---------------------------------------


def test_settle_and_claim_commits_both_and_the_claim_takes_the_rows_the_settlements_freed(
    clocked: tuple[PostgresStore, Clock], db: Db
) -> None:
    """One call settles a batch (its stale ticket refused alone) and claims in the same
    transaction: the second row of an ordered group, claimable only once the first settled,
    comes back from the same call, claimed at the moment the batch settled."""
    store, clock = clocked
    stale_claim, fresh = one_stale_among(store, clock, ["a", "b"])
    ordered = [
        Delivery(
            tenant_id="t1",
            operation_id=op,
            subscription="batch",
            job_type="job",
            target_class=TargetClass.B,
            payload=b"{}",
            ordering_key="g",
        )
        for op in ("g1", "g2")
    ]
    store.inbox.ingest(ordered)
    (g1,) = store.claims.claim("w1", 5, LONG)
    assert g1.operation_id == "g1"
    assert store.claims.claim("w1", 5, LONG) == [], "g2 waits behind g1"
    clock.advance(timedelta(seconds=1))

    batch = [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in [*fresh, g1, stale_claim]]
    done = store.claims.settle_and_claim(batch, "w1", LONG, limit=5)

    assert done.stale == [stale_claim.ticket]
    assert done.claim_error is None
    assert [c.operation_id for c in done.claims] == ["g2"]
    assert {op: state_of(db, op)[0] for op in ("a", "b", "g1", "g2", "stale")} == {
        "a": "succeeded",
        "b": "succeeded",
        "g1": "succeeded",
        "g2": "claimed",
        "stale": "claimed",  # the takeover's claim, untouched
    }
    (same,) = db.execute(
        "SELECT count(DISTINCT t) FROM (SELECT settled_at AS t FROM work_item"
        " WHERE operation_id IN ('a', 'b', 'g1') UNION ALL"
        " SELECT claimed_at FROM work_item WHERE operation_id = 'g2') x"
    ).fetchone() or (0,)
    assert same == 1, "settled and claimed in one transaction"


def test_a_claim_that_fails_leaves_the_settlements_written_alone(db_url: str, db: Db) -> None:
    """The claim waits for a lock another session holds on a table only the claim reads and
    runs out of lock_timeout: its transaction rolls back, the settlements with it, so they are
    written again alone; the claim's error comes back, and no row is claimed."""
    store = PostgresStore.connect(
        db_url, max_size=2, timeouts=SessionTimeouts(lock=timedelta(milliseconds=200))
    )
    try:
        store.inbox.ingest(deliveries(["a", "b", "c"]))
        claims = store.claims.claim("w1", 2, LONG)
        batch = [Settlement(c.ticket, State.FAILED_TERMINAL, "declined") for c in claims]
        with db.transaction():
            db.execute("LOCK TABLE rate_wait IN ACCESS EXCLUSIVE MODE")
            done = store.claims.settle_and_claim(batch, "w1", LONG, limit=2)
        assert isinstance(done.claim_error, StoreUnavailable)
        assert "lock_timeout" in str(done.claim_error)
        assert done.claims == []
        assert done.stale == []
        assert sorted(state_of(db, c.operation_id)[0] for c in claims) == ["failed_terminal"] * 2
        assert state_of(db, "c")[0] == "queued"
        (ended,) = db.execute(
            "SELECT count(*) FROM work_attempt WHERE outcome = 'failed_terminal'"
        ).fetchone() or (0,)
        assert ended == 2, "each attempt recorded once"
    finally:
        store.close()


def _backends_that_claimed(db: Db) -> list[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = %s AND datname = current_database()"
        " AND query LIKE '%%expired AS (%%'",  # the claim's start (the text shown is cut)
        (APPLICATION_NAME,),
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def test_a_thread_that_keeps_its_connection_claims_on_one_server_process_until_it_breaks(
    db_url: str, db: Db
) -> None:
    """Without keeping, a pool of four hands its oldest idle connection to each call, so eight
    claims run on four server processes; a thread that keeps one runs all of its calls on one.
    That process killed, the next call fails and gives it up, and the one after runs on
    another; released, it goes back to the pool."""
    store = PostgresStore.connect(db_url, min_size=4, max_size=4)
    try:
        store.pool.wait()
        for _ in range(8):
            store.claims.claim("w1", 1, LONG)
        assert len(_backends_that_claimed(db)) == 4

        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        )
        store.pool.check()
        eventually(lambda: store.pool.get_stats()["pool_available"] == 4, "the pool refilled")
        store.keep_connection()
        for _ in range(8):
            store.claims.claim("w1", 1, LONG)
        (kept,) = _backends_that_claimed(db)

        db.execute("SELECT pg_terminate_backend(%s)", (kept,))
        with pytest.raises(StoreUnavailable):
            store.claims.claim("w1", 1, LONG)
        store.claims.claim("w1", 1, LONG)
        store.claims.claim("w1", 1, LONG)
        (other,) = _backends_that_claimed(db)
        assert other != kept

        available = store.pool.get_stats
        # the broken connection is replaced in the background; the kept one stays out
        eventually(lambda: available()["pool_available"] == 3, "the pool replaced the broken one")
        store.release_connection()
        assert available()["pool_available"] == 4
    finally:
        store.close()
