"""New rows written already claimed for the local pool (:class:`~bridge.types.InsertClaim`):
which rows the insert takes, and a pool fed that way at volume, under races and a cut.

The insert claims a row exactly as the hand-off claim by key would a moment later: fence 1,
attempt 1, leased from the database clock, never beyond the slots the pool reserved, and never
a row that claim would skip (a rate limit's wait, an ordered group, a concurrency limit or
token rate, a job type the pool does not run, an identity key the process does not hold).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from bridge import keyring
from bridge.database import APPLICATION_NAME
from bridge.errors import StoreUnavailable
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox, Written
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.work import ConcurrencyLimit, Settlement
from bridge.types import Claim, Decision, Delivery, InsertClaim, RawDelivery, State
from tests.support.deliveries import delivery
from tests.support.erasure import erase_operation
from tests.support.held import HeldRows
from tests.support.policy import with_policy
from tests.support.proxy import Proxy
from tests.support.waiting import eventually

Db = psycopg.Connection[tuple[Any, ...]]
HASHER = IdentityHasher(b"insert-claims-tests-identity-key-0")
LEASE = timedelta(seconds=30)
DEADLINE = 120.0


def taking(limit: int, *job_types: str, worker: str = "w-insert") -> InsertClaim:
    return InsertClaim(worker, dict.fromkeys(job_types or ("refund",), LEASE), limit)


def rows(db: Db) -> dict[str, tuple[str, int, int, str | None]]:
    found = db.execute(
        "SELECT operation_id, state, fence, attempts, lease_owner FROM work_item"
    ).fetchall()
    return {op: (state, fence, attempts, owner) for op, state, fence, attempts, owner in found}


# -- which rows the insert takes -------------------------------------------------------------------


def test_an_all_new_batch_is_written_claimed_up_to_the_limit_in_delivery_order(
    store: PostgresStore, db: Db
) -> None:
    batch = [delivery(f"op-{i}") for i in range(10)]
    results = store.inbox.ingest(batch, taking(4))

    claimed = [r for r in results if r.claim is not None]
    assert [r.key for r in claimed] == [d.key for d in batch[:4]]
    assert all(r.decision is Decision.NEW for r in results)
    assert [r.state for r in results] == [State.CLAIMED] * 4 + [State.QUEUED] * 6
    found = rows(db)
    for i in range(10):
        expected = ("claimed", 1, 1, "w-insert") if i < 4 else ("queued", 0, 0, None)
        assert found[f"op-{i}"] == expected
    lease = db.execute(
        "SELECT lease_expires_at - claimed_at, claimed_at = created_at FROM work_item"
        " WHERE operation_id = 'op-0'"
    ).fetchone()
    assert lease == (LEASE, True), "leased from the insert's own clock, for the job's lease"
    first = claimed[0].claim
    assert first is not None
    assert (first.fence, first.attempts, first.takeover, first.intent_fence) == (1, 1, False, None)
    assert first.payload == batch[0].payload
    assert first.payload_hash == batch[0].payload_hash
    # What a worker writes under it is fenced as under any claim.
    assert (
        store.settle.settle_many([Settlement(t, State.SUCCEEDED, "ok") for t in [first.ticket]])
        == []
    )
    assert rows(db)["op-0"][0] == "succeeded"


def test_a_mixed_batch_is_claimed_the_careful_way_and_replays_and_conflicts_are_not(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("old-1"), delivery("old-2")])
    batch = [
        delivery("old-1"),  # replay
        delivery("old-2", payload=b'{"changed": true}'),  # conflict
        delivery("new-1"),
        delivery("new-1"),  # a duplicate inside the batch: a replay of its first
        delivery("new-2"),
    ]
    results = store.inbox.ingest(batch, taking(10))

    assert [r.decision for r in results] == [
        Decision.REPLAY,
        Decision.CONFLICT,
        Decision.NEW,
        Decision.REPLAY,
        Decision.NEW,
    ]
    assert [r.claim is not None for r in results] == [False, False, True, False, True]
    found = rows(db)
    assert found["old-1"] == found["old-2"] == ("queued", 0, 0, None)
    assert found["new-1"] == found["new-2"] == ("claimed", 1, 1, "w-insert")
    assert results[3].state is State.CLAIMED, "the replay in the batch sees its row claimed"


def test_rows_the_hand_off_claim_would_skip_are_written_queued(
    store: PostgresStore, db: Db
) -> None:
    """A rate limit's wait for (job type, tenant), an ordered group, a job type with a
    concurrency limit and a job type the pool does not run: queued, as their claim would
    leave them; the rest of the batch is claimed."""
    db.execute(
        "INSERT INTO rate_wait (job_type, tenant_id, until) VALUES ('refund', 'slow', now() + '1h')"
    )
    db.commit()
    store = with_policy(store, concurrency={"limited": ConcurrencyLimit(total=2)})
    batch = [
        delivery("waits", tenant="slow"),
        delivery("ordered", ordering_key="group-1"),
        delivery("limited", job_type="limited"),
        delivery("other", job_type="not-run-here"),
        delivery("free"),
    ]
    results = store.inbox.ingest(batch, taking(10, "refund", "limited"))

    assert [r.claim is not None for r in results] == [False, False, False, False, True]
    found = rows(db)
    assert {op for op, row in found.items() if row[0] == "claimed"} == {"free"}


def test_a_process_holding_not_the_key_it_writes_under_claims_nothing(
    store: PostgresStore, db: Db
) -> None:
    store.use_identity_keys(current=2, held=[1])
    results = store.inbox.ingest([delivery("op-1")], taking(1))
    assert results[0].claim is None
    assert rows(db)["op-1"][0] == "queued"


@pytest.mark.promise("erasure-keeps-dedupe")
def test_an_erased_operation_in_the_batch_is_a_replay_and_is_not_claimed(
    store: PostgresStore, db: Db
) -> None:
    keyring.attach(store.keys, HASHER, used_by="test")
    store.inbox.ingest([delivery("gone")])
    [claim] = store.claims.claim("w", 1, LEASE)
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    erase_operation(store, HASHER, "t1", "gone")
    results = store.inbox.ingest([delivery("gone"), delivery("fresh")], taking(2))
    assert [(r.decision, r.erased, r.claim is not None) for r in results] == [
        (Decision.REPLAY, True, False),
        (Decision.NEW, False, True),
    ]
    assert set(rows(db)) == {"fresh"}


# -- a pool fed by the insert, at volume ---------------------------------------------------------


class Runs(ConditionalWriteHandler):
    """Records every run by (operation, fence): a claim runs once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.runs: Counter[tuple[str, int]] = Counter()

    def handle(self, ctx: Context) -> None:
        with self._cond:
            self.runs[(ctx.operation_id, ctx.fence)] += 1
            self._cond.notify_all()

    def ran(self) -> int:
        """Operations run so far."""
        with self._cond:
            return len({op for op, _ in self.runs})

    def wait_until(self, check: Callable[[], bool], what: str) -> None:
        """Wait, woken by each run, until ``check`` holds; fail naming ``what``."""
        with self._cond:
            assert self._cond.wait_for(check, DEADLINE), f"timed out waiting for: {what}"


class Counting:
    """The store's general claims that found nothing (a claim of an empty queue)."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.empty = 0
        self._lock = threading.Lock()
        claim, both = store.claims.claim, store.claims.settle_and_claim

        def counted_claim(*args: Any, **kwargs: Any) -> list[Claim]:
            got = claim(*args, **kwargs)
            self._count(not got)
            return got

        def counted_both(*args: Any, **kwargs: Any) -> Any:
            done = both(*args, **kwargs)
            general = not kwargs.get("keys") and kwargs.get("limit", 0) > 0
            self._count(general and not done.claims)
            return done

        monkeypatch.setattr(store.claims, "claim", counted_claim)
        monkeypatch.setattr(store.claims, "settle_and_claim", counted_both)

    def _count(self, empty: bool) -> None:
        if empty:
            with self._lock:
                self.empty += 1


def through(proxy: Proxy, url: str) -> str:
    return conninfo.make_conninfo(url, host=proxy.host, port=str(proxy.port))


@pytest.fixture
def proxied(cluster_db_url: str, proxy: Proxy) -> Iterator[PostgresStore]:
    store = PostgresStore.connect(through(proxy, cluster_db_url), min_size=4, max_size=16)
    try:
        yield store
    finally:
        store.close()


@pytest.mark.slow
def test_racing_writers_feed_the_pool_by_insert_and_each_claim_runs_once_through_a_cut(
    proxied: PostgresStore, cluster_db_url: str, proxy: Proxy
) -> None:
    """Three writers deliver 1,200 operations each through the inbox, in batches of 10, in
    different orders (every key by every writer), one of them with a changed payload for every
    fifth key; a pool of 8 threads and 8 prefetched runs what they write, and paces them (a
    writer waits while the rows created and not yet run fill the pool). The proxy is cut
    mid-stream (again, until a write was caught in flight); a batch whose write failed is
    delivered again, as a broker redelivers what was not acknowledged. Each operation is
    created once and succeeds; rows reach the pool written claimed and run under that claim;
    a claim never runs twice; the rows held never exceed threads and prefetch; only rows the
    cut touched run under a second fence."""
    store = proxied
    keys = [f"op-{i}" for i in range(1200)]
    changed = set(keys[::5])
    handler = Runs()
    registry = Registry()
    registry.register("quick", handler, lease=timedelta(seconds=3))
    pool = WorkerPool(store, registry, HASHER, threads=8, prefetch=8, poll_interval=0.2)

    def decode(raw: RawDelivery) -> Delivery:
        return replace(
            delivery(raw.attributes["op"], tenant=f"t{int(raw.attributes['op'][3:]) % 4}"),
            job_type="quick",
            payload=raw.body,
        )

    inbox = Inbox(store.inbox, decode, pool=pool)
    decisions: Counter[Decision] = Counter()
    written_claimed: list[str] = []
    touched: set[str] = set()  # keys of writes that failed (their outcome may be in doubt)
    failures: list[BaseException] = []
    writing = [0]  # writes in flight
    finished = [0]  # writes that returned, and writers that ended
    lock = threading.Condition()  # notified as writes start and end: the cutter waits on it

    def room() -> bool:
        """The rows created and not yet run leave the pool room for a batch: the writers are
        paced by the pool, as a consumer whose pool keeps up is."""
        with lock:
            created = decisions[Decision.NEW]
        return created - len({op for op, _ in handler.runs}) <= 6

    def write(batch: list[RawDelivery], keys_of: list[str]) -> list[Written]:
        """As a consumer writes: a batch whose write failed is delivered again."""
        while True:
            with lock:
                writing[0] += 1
                lock.notify_all()
            try:
                return inbox.write(batch)
            except StoreUnavailable:
                with lock:
                    touched.update(keys_of)
            finally:
                with lock:
                    writing[0] -= 1
                    finished[0] += 1
                    lock.notify_all()

    def writer(index: int) -> None:
        order = keys if index != 1 else list(reversed(keys))
        try:
            for start in range(0, len(order), 10):
                handler.wait_until(room, "the pool to make room")
                batch = [
                    RawDelivery(
                        subscription="jobs",
                        message_id=None,
                        body=b"changed" if index == 2 and k in changed else b"{}",
                        attributes={"op": k},
                    )
                    for k in order[start : start + 10]
                ]
                written = write(batch, order[start : start + 10])
                with lock:
                    decisions.update(w.decision for w in written)
                    written_claimed.extend(
                        w.result.key.operation_id
                        for w in written
                        if w.result.claim is not None and w.result.key is not None
                    )
        except BaseException as exc:  # noqa: BLE001  (asserted below)
            failures.append(exc)
        finally:
            with lock:
                finished[0] += 1  # wakes the cutter when the last writer ends
                lock.notify_all()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    pool.start()
    held = HeldRows(cluster_db_url)
    try:
        with held:
            for t in threads:
                t.start()
            eventually(lambda: decisions.total() >= 1200, "a third of the deliveries", DEADLINE)
            cuts = 0
            with lock:
                while any(t.is_alive() for t in threads) and not touched and cuts < 50:
                    # Cut while a write is in flight, then let the writes go on before the next.
                    lock.wait_for(lambda: writing[0] > 0 or touched, timeout=1.0)
                    if touched or writing[0] == 0:
                        continue
                    cuts += 1  # every connection cut: writes, claims and settlements in flight
                    proxy.stop()
                    proxy.start()
                    after = finished[0]
                    lock.wait_for(lambda after=after: finished[0] > after, timeout=DEADLINE)
            for t in threads:
                t.join(timeout=DEADLINE)
            with psycopg.connect(cluster_db_url) as db:
                eventually(
                    lambda: (
                        db.execute(
                            "SELECT count(*) FROM work_item WHERE state = 'succeeded'"
                        ).fetchone()
                        == (1200,)
                    ),
                    "every operation succeeded",
                    DEADLINE,
                )
                fences: dict[str, int] = dict(
                    db.execute("SELECT operation_id, fence FROM work_item").fetchall()
                )
                recorded = db.execute("SELECT count(*) FROM rejected_delivery").fetchone()
    finally:
        pool.stop(deadline=5)
    assert not failures, failures
    assert touched, "the cut failed some write"
    assert len(fences) == 1200
    assert decisions.total() == 3 * 1200
    assert 1200 - len(touched) <= decisions[Decision.NEW] <= 1200
    assert len(changed) <= decisions[Decision.CONFLICT] <= 2 * len(changed)
    assert recorded is not None
    assert recorded[0] >= decisions[Decision.CONFLICT]

    # Two writers reserve slots for the same keys and one of them finds them existing, so
    # fewer rows are written claimed here than where writers do not race (34 to 138 of 1,200).
    assert len(written_claimed) >= 20, "new rows reached the pool written claimed"
    assert len(set(written_claimed)) == len(written_claimed), "a row was written claimed twice"
    assert {(op, 1) for op in written_claimed} <= set(handler.runs), (
        "a row written claimed for the pool did not run under that claim"
    )
    assert all(n == 1 for n in handler.runs.values()), "a claim ran twice"
    assert {op for op, _ in handler.runs} == set(keys)
    again = {op for op, fence in fences.items() if fence > 1}
    # A row runs again only where a cut touched it: its write failed (committed claimed for
    # nobody: its lease lapsed and the rescue claim took it over), or its claim or settlement
    # was cut: at most the rows held and the writes in flight, at each cut.
    assert len(again) <= cuts * (8 + 8 + 3 * 10)
    most = held.most(besides={(op, 1) for op in again})
    assert len(held.samples) > 50, "the drain was sampled all along"
    assert most <= 8 + 8, f"the pool held {most} rows at once, 8 threads + 8 prefetched"


@pytest.mark.slow
def test_a_queued_row_nobody_handed_off_is_claimed_within_the_poll_interval(
    store: PostgresStore, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While everything the inbox writes reaches the pool (written claimed, or queued and
    claimed while it waits beyond what a round takes), the claim of any claimable row (a retry
    come due, a row another process wrote) runs once per poll interval while it finds
    nothing, not at every settlement; a row queued behind the pool's back is still run."""
    handler = Runs()
    registry = Registry()
    registry.register("quick", handler, lease=timedelta(seconds=30))
    counting = Counting(store, monkeypatch)
    pool = WorkerPool(store, registry, HASHER, threads=4, poll_interval=0.5)

    def decode(raw: RawDelivery) -> Delivery:
        return replace(delivery(raw.attributes["op"]), job_type="quick")

    inbox = Inbox(store.inbox, decode, pool=pool)
    pool.start()
    try:
        for start in range(0, 1000, 10):
            inbox.write(
                [
                    RawDelivery(
                        subscription="jobs",
                        message_id=None,
                        body=b"{}",
                        attributes={"op": f"op-{i}"},
                    )
                    for i in range(start, start + 10)
                ]
            )
        eventually(lambda: len(handler.runs) == 1000, "every written row ran", DEADLINE)
        empty = counting.empty
        store.inbox.ingest([replace(delivery("behind"), job_type="quick")])  # no pool asked
        eventually(lambda: ("behind", 1) in handler.runs, "the queued row ran", DEADLINE)
    finally:
        pool.stop(deadline=5)
    settled = db.execute("SELECT count(*) FROM work_item WHERE state = 'succeeded'").fetchone()
    assert settled == (1001,)
    assert empty < 100, f"{empty} claims of an empty queue for 100 batches written"


class InOrder(ConditionalWriteHandler):
    """Records the order rows ran in, per ordered group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.order: dict[str, list[int]] = {}

    def handle(self, ctx: Context) -> None:
        group, index = ctx.operation_id.split("-")
        with self._lock:
            self.order.setdefault(group, []).append(int(index))

    def ran(self) -> set[str]:
        with self._lock:
            return {f"{g}-{i:04d}" for g, indices in self.order.items() for i in indices}


@pytest.mark.slow
def test_ordered_groups_run_in_order_each_row_as_its_predecessor_settles_not_at_the_poll(
    store: PostgresStore, db: Db
) -> None:
    """Rows of an ordered group are never written claimed: they are handed off, and the claim
    by key takes only the earliest open row of each group. The next one becomes claimable when
    its predecessor settles, and the settlement's round claims it then, not at the next poll:
    1,000 rows in 10 groups drain with a 5 s poll interval (a wait for the poll per row would
    take over 8 minutes a group). Every fifth batch is delivered twice, one delivery conflicts,
    and every connection of the pool is killed mid-drain; each group runs in its order."""
    handler = InOrder()
    registry = Registry()
    registry.register("ordered", handler, lease=timedelta(seconds=2))
    pool = WorkerPool(store, registry, HASHER, threads=8, prefetch=8, poll_interval=5.0)
    ops = [f"g{i % 10}-{i // 10:04d}" for i in range(1000)]

    def decode(raw: RawDelivery) -> Delivery:
        op = raw.attributes["op"]
        return replace(
            delivery(op, ordering_key=op.split("-")[0]), job_type="ordered", payload=raw.body
        )

    def raw(op: str, body: bytes = b"{}") -> RawDelivery:
        return RawDelivery(subscription="jobs", message_id=None, body=body, attributes={"op": op})

    inbox = Inbox(store.inbox, decode, pool=pool)

    def write(batch: list[RawDelivery]) -> list[Written]:
        """As a consumer writes: a batch whose write failed is delivered again."""
        for _ in range(50):
            try:
                return inbox.write(batch)
            except StoreUnavailable:
                time.sleep(0.05)
        raise AssertionError("a batch could not be written")

    pool.start()
    try:
        written: Counter[Decision] = Counter()
        for n, start in enumerate(range(0, len(ops), 10)):
            batch = [raw(op) for op in ops[start : start + 10]]
            results = write(batch)
            assert all(w.result.claim is None for w in results), "an ordered row written claimed"
            written.update(w.decision for w in results)
            if n % 5 == 0:
                written.update(w.decision for w in write(batch))
            if n == 50:
                killed = db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND datname = current_database()",
                    (APPLICATION_NAME,),
                ).fetchall()
                assert killed, "the pool's connections were found and killed"
        (conflict,) = write([raw(ops[3], b'{"other": 1}')])
        assert conflict.decision is Decision.CONFLICT
        eventually(lambda: handler.ran() == set(ops), "every ordered row ran", DEADLINE)
        eventually(
            lambda: (
                db.execute("SELECT count(*) FROM work_item WHERE state = 'succeeded'").fetchone()
                == (1000,)
            ),
            "every row settled",
            DEADLINE,
        )
    finally:
        pool.stop(deadline=5)
    # A batch cut after its commit came back as replays.
    assert 990 <= written[Decision.NEW] <= 1000
    assert 200 <= written[Decision.REPLAY] <= 210
    for group, indices in handler.order.items():
        firsts = list(dict.fromkeys(indices))  # a row run again after the kill counts once
        assert firsts == sorted(firsts), f"group {group} ran out of order"
