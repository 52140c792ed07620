"""A silent network between the bridge and its database, longer than a lease, then healed.

The bridge's connections go through the test's TCP proxy. Mid-run the proxy hangs: nothing is
forwarded either way and nothing is reset, so every statement in flight and every new one waits
with no error, while the database's clock runs past the lease of every claim the pool holds.
Then it heals, with 10 ms of latency added to every chunk each way from then on. 1,000 class A
operations (100 delivered twice) run through a worker pool of four threads: every one succeeds,
its effect committed exactly once, nothing left claimed or queued.

(What the proxy cannot show: its own kernel acknowledges the bytes it holds, so the client's
TCP keepalives and ``tcp_user_timeout`` never fire through it, as they do when a route drops
packets; a real drop is ``acceptance/test_database_partition.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from bridge.executors.registry import Registry
from bridge.handlers import RetryPolicy
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from tests.support.deliveries import for_job
from tests.support.handlers import RecordEffect, create_tables
from tests.support.proxy import Proxy
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow
HASHER = IdentityHasher(b"network-hang-tests-identity-key-0")
OPERATIONS = 1_000
DUPLICATES = 100
LEASE = timedelta(seconds=2)


def query(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement.encode()).fetchall()


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    params = conninfo.conninfo_to_dict(db_url)
    host = str(params.get("host") or "127.0.0.1")
    if host.startswith("/"):
        pytest.skip("the test database listens on a Unix socket; the proxy needs TCP")
    with Proxy(host, int(params.get("port") or 5432)) as p:
        yield p


def test_a_hang_longer_than_the_lease_then_latency_leaves_nothing_twice_lost_or_stuck(
    db_url: str, proxy: Proxy
) -> None:
    create_tables(db_url)
    registry = Registry()
    registry.register(
        "ledger",
        RecordEffect(),
        lease=LEASE,
        retry=RetryPolicy(max_attempts=20, backoff_initial=timedelta(milliseconds=50)),
    )
    ops = [f"op-{i}" for i in range(OPERATIONS)]
    store = PostgresStore.connect(
        conninfo.make_conninfo(db_url, host=proxy.host, port=str(proxy.port)), max_size=10
    )
    pool = WorkerPool(store, registry, HASHER, threads=4, poll_interval=0.05)
    try:
        store.inbox.ingest([for_job(registry, "ledger", op) for op in ops])
        store.inbox.ingest([for_job(registry, "ledger", op) for op in ops[:DUPLICATES]])  # replays
        pool.start()
        eventually(
            lambda: query(db_url, "SELECT count(*) FROM test_effect")[0][0] >= 300,
            "the pool at work",
        )
        proxy.hang()
        # Silence until every lease the pool held has run out on the database's clock.
        ((held_until,),) = query(
            db_url, "SELECT coalesce(max(lease_expires_at), now()) FROM work_item"
        )
        eventually(
            lambda: query(db_url, "SELECT now()")[0][0] > held_until,
            "the database's clock past every lease",
        )
        assert proxy.hung
        proxy.latency = 0.01
        proxy.heal()
        eventually(
            lambda: (
                query(db_url, "SELECT count(*) FROM work_item WHERE state <> 'succeeded'")[0][0]
                == 0
            ),
            "every operation settled after the heal",
        )
    finally:
        proxy.heal()
        report = pool.stop()
        store.close()
    effects = dict(query(db_url, "SELECT operation_id, count(*) FROM test_effect GROUP BY 1"))
    assert set(effects) == set(ops), "nothing lost"
    assert set(effects.values()) == {1}, "nothing applied twice"
    assert query(db_url, "SELECT count(*) FROM work_item") == [(OPERATIONS,)]
    assert report is not None
