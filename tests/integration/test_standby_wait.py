"""``wait_for_standby``: a broker ack and a class D call wait until a standby has the commit.

A primary and a streaming standby (tests/support/replication.py), asynchronous. While the
replication link hangs, a commit is acknowledged to the bridge but the standby lacks it: a
failover then would lose it. With the wait, the inbox refuses to let the batch be acked and the
class D executor makes no call (its intent withdrawn, the row retried), each within the
subscription's bound; once the link heals both go through, and the class D call is made once.
Without the wait (the old code) the batch returns for acking and the call is made at once.
A failover between a commit and its wait confirms nothing: the server answering the wait is
not the one that took the commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from bridge.errors import StandbyNotConfirmed
from bridge.executors.registry import Registry
from bridge.handlers import Context, RetryPolicy, Success, UnfencedHandler
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.store.replication import StandbyWait
from bridge.types import Delivery, RawDelivery
from tests.support.deliveries import for_job
from tests.support.replication import Pair, replicated_pair
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow
HASHER = IdentityHasher(b"standby-wait-tests-identity-key-0")


class Notify(UnfencedHandler):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def call(self, ctx: Context) -> Success:
        with self._lock:
            self.calls.append((ctx.operation_id, ctx.fence))
        return Success()


@pytest.fixture
def pair() -> Iterator[Pair]:
    with replicated_pair("async") as pair:
        with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE fb")
        with psycopg.connect(pair.url("fb"), autocommit=True) as conn:
            migrate(conn)
        yield pair


@pytest.fixture
def store(pair: Pair) -> Iterator[PostgresStore]:
    s = PostgresStore.connect(pair.url("fb"), max_size=8)
    try:
        yield s
    finally:
        s.close()


def test_a_wait_is_confirmed_once_the_standby_has_the_commit_and_gives_up_at_its_bound(
    pair: Pair, store: PostgresStore
) -> None:
    seen: list[tuple[str, str, bool]] = []
    standby = StandbyWait(
        store,
        {"jobs": 0.5},
        observe=lambda sub, purpose, _seconds, ok: seen.append((sub, purpose, ok)),
    )
    assert standby.applies("jobs")
    assert not standby.applies("other")
    store.inbox.ingest([for_job(_registry(Notify()), "notify", "op-1")])
    standby.wait("jobs", "ack")
    pair.stall()
    store.inbox.ingest([for_job(_registry(Notify()), "notify", "op-2")])
    with pytest.raises(StandbyNotConfirmed, match=r"within 0.5s \(1 streaming\)"):
        standby.wait("jobs", "ack")
    pair.resume()
    standby.wait("jobs", "intent")
    assert seen == [("jobs", "ack", True), ("jobs", "ack", False), ("jobs", "intent", True)]


def test_a_failover_between_the_commit_and_its_wait_confirms_nothing(
    pair: Pair, store: PostgresStore
) -> None:
    """The commit went to the old primary, which the standby never got (the link hung); the
    primary dies, the standby is promoted and the old node rebuilt as its caught-up standby.
    The wait's connection now reaches the promoted server, whose own standby has flushed
    everything it has: that says nothing of the lost commit (before the fix the wait read the
    new server's position there and confirmed, and the consumer acked a delivery no server
    held; a class D call was made whose intent no server held)."""
    standby = StandbyWait(store, {"jobs": 0.5})
    pair.stall()
    store.inbox.ingest([for_job(_registry(Notify()), "notify", "op-lost")])
    pair.kill_primary()
    pair.promote()
    pair.rebuild()
    pair.wait_caught_up()
    store.pool.check()  # the connections to the dead primary are gone: the next one is new
    with pytest.raises(StandbyNotConfirmed, match="no longer answers"):
        standby.wait("jobs", "ack")
    with psycopg.connect(pair.url("fb"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM work_item").fetchone() == (0,)
    # A commit on the promoted server is confirmed as before.
    store.inbox.ingest([for_job(_registry(Notify()), "notify", "op-kept")])
    standby.wait("jobs", "ack")


def test_the_inbox_lets_nothing_be_acked_until_the_standby_has_the_batch(
    pair: Pair, store: PostgresStore
) -> None:
    registry = _registry(Notify())
    raw = [for_job(registry, "notify", f"op-{i}") for i in range(5)]
    standby = StandbyWait(store, {"jobs": 0.5})
    by_id = {d.operation_id: d for d in raw}
    waiting = Inbox(store.inbox, lambda r: by_id[str(r.message_id)], standby=standby)
    plain = Inbox(store.inbox, lambda r: by_id[str(r.message_id)])
    pair.stall()
    # the old code: the batch returns, and the consumer acks what the standby lacks
    assert len(plain.write([_raw(d) for d in raw[:2]])) == 2
    with pytest.raises(StandbyNotConfirmed):
        waiting.write([_raw(d) for d in raw[2:]])
    pair.resume()
    assert len(waiting.write([_raw(d) for d in raw[2:]])) == 3  # replays now, and acked


def test_a_class_d_call_waits_for_its_intent_on_the_standby_and_is_made_once(
    pair: Pair, store: PostgresStore
) -> None:
    handler = Notify()
    registry = _registry(handler)
    store.inbox.ingest([for_job(registry, "notify", f"op-{i}") for i in range(20)])
    pair.wait_caught_up()
    pair.stall()
    standby = StandbyWait(store, {"jobs": 0.3})
    pool = WorkerPool(store, registry, HASHER, threads=4, poll_interval=0.05, standby=standby)
    pool.start()
    try:
        eventually(lambda: pool.counts["settled.queued"] >= 20, "every run to wait and give way")
        assert handler.calls == [], "no call while the standby lacks the intent"
        with psycopg.connect(pair.url("fb")) as conn:
            left = conn.execute(
                "SELECT count(*) FILTER (WHERE intent_fence IS NOT NULL AND state <> 'claimed'),"
                "       count(*) FILTER (WHERE state NOT IN ('queued', 'claimed'))"
                "  FROM work_item"
            ).fetchone()
        assert left == (0, 0), "every intent withdrawn as its row went back, none parked"
        pair.resume()
        eventually(lambda: len(handler.calls) == 20, "every call once the standby has caught up")
    finally:
        pool.stop()
    assert sorted(op for op, _ in handler.calls) == sorted(f"op-{i}" for i in range(20))
    with psycopg.connect(pair.url("fb")) as conn:
        states = conn.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    assert states == [("succeeded", 20)]


def _registry(handler: Notify) -> Registry:
    registry = Registry()
    registry.register(
        "notify",
        handler,
        retry=RetryPolicy(max_attempts=1),
    )
    return registry


def _raw(d: Delivery) -> RawDelivery:
    return RawDelivery(
        subscription=d.subscription, message_id=d.operation_id, body=d.payload, attributes={}
    )
