"""A fence never goes backwards across a failover, even when the promoted server missed the last
claims: the fence's epoch is the server's timeline (migration 0029_fence_epoch.sql).

A primary and a streaming standby (tests/support/replication.py); the replication link hangs,
the old primary issues claims its standby never receives, acknowledged all the same, then dies
(``kill -9``) and the standby is promoted. On the old code every such row was claimed again
under the fence the lost claim had issued (two claims, one fence: a class B target accepts the
stale worker's write); now every fence after the promotion is above every fence before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.types import InsertClaim
from tests.support.deliveries import delivery
from tests.support.replication import Pair, replicated_pair

pytestmark = pytest.mark.slow
LEASE = timedelta(minutes=5)


@pytest.fixture
def pair() -> Iterator[Pair]:
    with replicated_pair("async") as pair:
        with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE fb")
        with psycopg.connect(pair.url("fb"), autocommit=True) as conn:
            migrate(conn)
        yield pair


def fences(store: PostgresStore, worker: str, limit: int) -> dict[str, int]:
    return {c.operation_id: c.fence for c in store.claims.claim(worker, limit, LEASE)}


def test_claims_the_promoted_server_missed_are_never_issued_the_same_fence_again(
    pair: Pair,
) -> None:
    store = PostgresStore.connect(pair.url("fb"), max_size=2)
    try:
        store.inbox.ingest([delivery(f"op-{i}") for i in range(40)])
        # a first round everywhere: fence 1, replicated
        first = fences(store, "old-1", 20)
        assert set(first.values()) == {1}
        pair.wait_caught_up()
        pair.stall()
        # acknowledged on the old primary, never received by its standby: fence 1 for the
        # rest, and the new rows an insert claims for its pool
        lost = fences(store, "old-2", 20)
        results = store.inbox.ingest(
            [delivery(f"new-{i}") for i in range(10)],
            InsertClaim("old-3", {"refund": LEASE}, 10),
        )
        lost.update({r.key.operation_id: r.claim.fence for r in results if r.claim})
        assert len(lost) == 30
        assert pair.lag_bytes() > 0
    finally:
        store.close()
    pair.kill_primary()
    pair.promote()

    store = PostgresStore.connect(pair.url("fb"), max_size=2)
    try:
        # the rows the lost claims took are queued on the new primary; the new ones are gone
        # and come back from the broker
        again = fences(store, "new-1", 40)
        results = store.inbox.ingest(
            [delivery(f"new-{i}") for i in range(10)],
            InsertClaim("new-2", {"refund": LEASE}, 10),
        )
        again.update({r.key.operation_id: r.claim.fence for r in results if r.claim})
    finally:
        store.close()
    assert set(again) == {f"op-{i}" for i in range(20, 40)} | {f"new-{i}" for i in range(10)}
    before = max([*first.values(), *lost.values()])
    assert min(again.values()) > before, "a fence issued after the promotion is above all before"
    assert set(again.values()) == {(1 << 32) + 1}, "the first claim of timeline 2's epoch"
