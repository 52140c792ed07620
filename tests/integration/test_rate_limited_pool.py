"""A worker pool draining a large mixed-tenant batch while one tenant's target rate-limits it.

Real leases and the database clock: the pool runs as in production. What is asserted is the
outcome (every operation succeeded exactly once, no attempt used by the limits, no run of the
limited key started while its wait was on, by the database's own attempt records), never how
long anything took.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, RateLimited, RetryPolicy
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.types import Ticket
from tests.support.attempts import ENDED_ATTEMPTS
from tests.support.deliveries import for_job
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"rate-limit-pool-tests-identity-secret")
TENANTS = ("t0", "t1", "t2", "t3")
PER_TENANT = 260
LIMITED = "t0"
LIMITS = 3
WAIT = timedelta(seconds=1)


class LimitedTarget(ConditionalWriteHandler):
    """A target that refuses its first few calls for one tenant; records every success."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.limits_left = LIMITS
        self.succeeded: Counter[tuple[str, str]] = Counter()

    def handle(self, ctx: Context) -> None:
        with self._lock:
            if ctx.tenant_id == LIMITED and self.limits_left > 0:
                self.limits_left -= 1
                raise RateLimited(retry_after=WAIT)
            self.succeeded[(ctx.tenant_id, ctx.operation_id)] += 1


@pytest.fixture
def pool_store(db_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.connect(db_url, max_size=10)
    try:
        yield store
    finally:
        store.close()


def count(db: Db, query: str) -> int:
    found = db.execute(query).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.slow
def test_a_rate_limited_tenant_waits_while_the_others_drain_and_nothing_runs_twice(
    pool_store: PostgresStore, db: Db
) -> None:
    target = LimitedTarget()
    registry = Registry()
    # One attempt each: a rate limit that used one up would leave the row nothing to run with.
    registry.register("limited", target, retry=RetryPolicy(max_attempts=1))
    batch = [
        for_job(registry, "limited", f"op-{i}", {"i": i}, tenant=tenant)
        for tenant in TENANTS
        for i in range(PER_TENANT)
    ]
    for start in range(0, len(batch), 500):
        pool_store.inbox.ingest(batch[start : start + 500])

    # When each limit's write had committed, by the database clock (an upper bound: read once
    # the write returned). A claim already under way then may not have seen the wait yet; one
    # that began after it must skip the key.
    committed: dict[str, datetime] = {}
    rate_limited = pool_store.settle.rate_limited

    def noting(ticket: Ticket, *args: Any, **kwargs: Any) -> None:
        rate_limited(ticket, *args, **kwargs)
        with psycopg.connect(db.info.dsn, autocommit=True) as conn:
            (now,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
        committed[ticket.operation_id] = now

    pool_store.settle.rate_limited = noting  # type: ignore[method-assign]
    pool = WorkerPool(pool_store, registry, HASHER, threads=4, poll_interval=0.05)
    pool.start()
    try:
        eventually(
            lambda: (
                count(db, "SELECT count(*) FROM work_item WHERE state = 'succeeded'") == len(batch)
            ),
            "every operation succeeded",
        )
    finally:
        report = pool.stop(deadline=10)

    assert report.abandoned == 0
    assert target.limits_left == 0
    expected = {(d.tenant_id, d.operation_id) for d in batch}
    assert set(target.succeeded) == expected
    assert set(target.succeeded.values()) == {1}, "each operation succeeded exactly once"
    assert count(db, "SELECT count(*) FROM work_item WHERE attempts <> 1") == 0
    counts = pool.counts.snapshot()
    assert counts["settled.queued"] == LIMITS
    assert counts["settled.succeeded"] == len(batch)
    assert "settled.failed_terminal" not in counts

    # The database's attempt records: every limit ended an attempt as queued, and no attempt
    # of the limited key started while that key's wait was on, from its commit to its end.
    limits = db.execute(
        "SELECT tenant_id, operation_id, ended_at FROM work_attempt"
        " WHERE outcome_code = 'rate_limited'"
    ).fetchall()
    assert [t for t, _, _ in limits] == [LIMITED] * LIMITS
    assert sorted(committed) == sorted(op for _, op, _ in limits)
    waits = [(committed[op], ended + WAIT) for _, op, ended in limits]
    started = [
        s
        for (s,) in db.execute(
            f"SELECT started_at FROM {ENDED_ATTEMPTS} a WHERE tenant_id = %s", (LIMITED,)
        ).fetchall()
    ]
    during = [s for s in started for begun, end in waits if begun < s < end]
    assert during == [], "an attempt of the limited key started while its wait was on"
    assert count(db, "SELECT count(*) FROM rate_wait WHERE tenant_id <> 't0'") == 0
