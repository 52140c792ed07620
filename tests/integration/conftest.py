"""Integration fixtures: a store on an injected clock, and for fault injection a PostgreSQL
server a test may crash and a proxy it may cut.

The fault-injection fixtures run against their own throwaway server (never the shared test
server), because a test that SIGKILLs the postmaster must own it.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from bridge import embedded
from bridge.errors import ConfigError
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from tests.support.clock import Clock
from tests.support.cluster import Cluster, throwaway_cluster
from tests.support.postgres import create_database, drop_database, unique_name
from tests.support.proxy import Proxy, proxy_to


@pytest.fixture
def clock() -> Clock:
    """Starts at :data:`tests.support.clock.EPOCH`, in the past on purpose: the clock rules."""
    return Clock()


@pytest.fixture
def clocked(store: PostgresStore, clock: Clock) -> PostgresStore:
    """The test's store, reading time from ``clock`` instead of the database."""
    return PostgresStore(store.pool, clock=clock)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """The run's throwaway server (embedded PostgreSQL binaries), started on first use."""
    try:
        embedded.binaries()
    except ConfigError as exc:
        pytest.skip(f"fault-injection tests need the embedded binaries: {exc}")
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(pg_cluster: Cluster) -> Cluster:
    """The throwaway server, running: a test may crash it; the next one finds it up again."""
    pg_cluster.start()
    return pg_cluster


@pytest.fixture
def cluster_db_url(cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database on the throwaway server, reached over TCP."""
    name = unique_name("fbf")
    url = create_database(cluster.url(), name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield url
    finally:
        cluster.start()
        drop_database(cluster.url(), name)


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    """A started TCP proxy in front of the throwaway server; cut with ``stop()``."""
    with proxy_to(cluster.host, cluster.port) as p:
        yield p
