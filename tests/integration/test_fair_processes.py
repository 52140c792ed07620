"""A tenant's backlog of 50,000 rows does not delay a quiet tenant, across three processes.

Three processes each run a worker pool of their own (their own connections, walk and cursor)
on one job type, as three replicas would. One tenant has a backlog of 50,000 queued rows; while
the pools drain it, a quiet tenant sends a row every few milliseconds. What is measured is
order, from the database's own timestamps, never a duration: for each quiet row, how many of the
flood's rows were claimed after it was written and before it was claimed. With tenant fairness,
every claim walks both tenants, so that is at most a few claims' worth; the same run without
fairness, on a backlog a tenth the size, shows the quiet rows waiting behind the backlog.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import psycopg
import pytest

from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from tests.support.deliveries import for_job
from tests.support.policy import with_policy
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"fair-process-tests-identity-secret")
JOB = "quick"
PROCESSES = 3
THREADS = 4
QUIET_ROWS = 40
DEADLINE = 180.0
#: the flood rows that claims already under way can hold: three replicas, up to four claims'
#: worth of rows each (the bound on how many rows pass a quiet row with fairness on)
IN_FLIGHT = PROCESSES * THREADS * 4

BACKLOG = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref)
SELECT 'flood', 'flood-' || g, 'orders', %(job)s, 'B', sha256(g::text::bytea), 'none:' || g
  FROM generate_series(1, %(rows)s::int) AS g
"""

#: per quiet row, the flood rows claimed by claims that began once the row was committed
#: (``visible``: the database clock read just after its write returned) and before its claim;
#: its created_at is the start of its write, and a commit that stalls (a slow fsync on a busy
#: machine) would count the claims that could not yet see it. Beside it, the flood rows claimed
#: at any time after it became visible: in the order rows became due, once the quiet row is
#: claimed, those are the backlog that was still queued ahead of it.
OVERTAKEN = """
SELECT q.operation_id,
       (SELECT count(*) FROM work_item f
         WHERE f.tenant_id = 'flood'
           AND f.claimed_at > v.visible AND f.claimed_at < q.claimed_at),
       (SELECT count(*) FROM work_item f
         WHERE f.tenant_id = 'flood' AND f.claimed_at > v.visible)
  FROM work_item q
  JOIN unnest(%(ops)s::text[], %(visible)s::timestamptz[]) AS v(operation_id, visible)
    ON v.operation_id = q.operation_id
 WHERE q.tenant_id = 'quiet'
"""


class Quick(ConditionalWriteHandler):
    """Returns at once: the run is the claim and the fenced settlement."""

    def handle(self, ctx: Context) -> None:
        return None


def registry() -> Registry:
    found = Registry()
    found.register(JOB, Quick())
    return found


def replica(url: str, fairness: bool, stop: Any) -> None:
    """One bridge's worker pool in a process of its own, until ``stop`` is set."""
    store = PostgresStore.connect(url, max_size=THREADS + 3, generic_plans=True)
    if fairness:
        store = with_policy(store, fairness={})
    try:
        pool = WorkerPool(store, registry(), HASHER, threads=THREADS, poll_interval=0.05)
        pool.start()
        stop.wait(DEADLINE)
        pool.stop(deadline=10)
    finally:
        store.close()


def overtaken(
    db_url: str, store: PostgresStore, *, backlog: int, fairness: bool
) -> tuple[list[tuple[int, int]], int]:
    """Run three replicas on a backlog while the quiet tenant trickles in; per quiet row, the
    flood rows claimed between its write and its claim and those claimed at any time after its
    write (in due order, the backlog still queued ahead of it); and the flood rows claimed in
    all."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(BACKLOG, {"job": JOB, "rows": backlog})
        conn.execute("VACUUM ANALYZE work_item")
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    replicas = [
        context.Process(target=replica, args=(db_url, fairness, stop)) for _ in range(PROCESSES)
    ]
    for process in replicas:
        process.start()
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:

            def claimed(tenant: str) -> int:
                found = conn.execute(
                    "SELECT count(*) FROM work_item WHERE tenant_id = %s AND fence > 0",
                    (tenant,),
                ).fetchone()
                return int(found[0]) if found else 0

            eventually(lambda: claimed("flood") >= 200, "the replicas draining the backlog")
            quick = registry()
            visible: dict[str, Any] = {}
            for i in range(QUIET_ROWS):
                store.inbox.ingest([for_job(quick, JOB, f"quiet-{i}", tenant="quiet")])
                found = conn.execute("SELECT now()").fetchone()
                assert found is not None
                visible[f"quiet-{i}"] = found[0]
                time.sleep(0.02)  # a trickle: each row arrives on a busy queue of its own
            eventually(lambda: claimed("quiet") == QUIET_ROWS, "every quiet row claimed", DEADLINE)
            flood = claimed("flood")
            rows = conn.execute(
                OVERTAKEN, {"ops": list(visible), "visible": list(visible.values())}
            ).fetchall()
    finally:
        stop.set()
        for process in replicas:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert len(rows) == QUIET_ROWS
    return [(int(n), int(ahead)) for _, n, ahead in rows], flood


@pytest.mark.slow
def test_a_flood_of_fifty_thousand_rows_does_not_delay_a_quiet_tenant(
    db_url: str, store: PostgresStore
) -> None:
    found, flood = overtaken(db_url, store, backlog=50_000, fairness=True)
    assert flood < 50_000, "the backlog was there all along"
    # Three replicas, each with a claim of up to four rows in flight: a quiet row is claimed by
    # the next claim of any of them, so only claims already under way can pass it.
    passed = [n for n, _ in found]
    assert max(passed) <= IN_FLIGHT, sorted(passed)


@pytest.mark.slow
def test_without_fairness_the_quiet_tenant_waits_behind_the_backlog(
    db_url: str, store: PostgresStore
) -> None:
    """The measurement tells the two apart: in the order rows became due, a quiet row is
    claimed after the backlog still queued when it was written (however much of the backlog
    the replicas drained while the quiet rows trickled in), less the claims under way."""
    found, _ = overtaken(db_url, store, backlog=5_000, fairness=False)
    assert all(ahead - n <= IN_FLIGHT for n, ahead in found), sorted(found)
    # The first quiet row came once 200 of the 5,000 were claimed: thousands passed it.
    assert max(n for n, _ in found) > 1000, sorted(found)
