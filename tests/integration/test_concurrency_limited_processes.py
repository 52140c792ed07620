"""A concurrency limit of 3 across three processes, one of them paused past its lease.

Each process runs a worker pool of its own (its own connections, several threads) on one job
type limited to 3 runs at once. The handler is a class B target in the same database, on its
own connection: it records each run's start and end in a ledger, then writes the effect with
the store's conditional write on the fence. One process is SIGSTOPped while a run of it is in
progress, stays stopped until another process has taken over that run's row, and is then
continued, so its late runs and writes happen after the takeover.

What is asserted is the documented guarantee, from the ledger, in SQL: at any instant, the
runs in progress that belong to a claimed row (a run counts from its start until it ended or
its row was settled, whichever came first) are runs of at most 3 rows. A run taken over and its
takeover are runs of one row: they share its slot. And every operation succeeded exactly once,
the effect carrying the fence of the claim that settled it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.database import SessionTimeouts
from bridge.executors.registry import Registry
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.work import ConcurrencyLimit
from tests.support.attempts import ENDED_ATTEMPTS
from tests.support.deliveries import for_job
from tests.support.ledger import LEDGER, count, ledgered_registry, running, succeeded
from tests.support.policy import with_policy
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"concurrency-limit-process-tests-secret")
JOB = "ledgered"
LIMIT = 3
OPERATIONS = 1200
PROCESSES = 3
#: a run's simulated work; short, so that the drain is quick but runs overlap
WORK_SECONDS = 0.003
LEASE = timedelta(seconds=2)
#: a paused process that stopped inside a claim transaction holds its locks until this ends it
IDLE_IN_TRANSACTION = timedelta(seconds=3)
DEADLINE = 180.0


#: the most rows with a covered run in progress at one instant (a maximum is reached at a start)
OVERLAP = """
WITH runs AS (
    SELECT l.tenant_id, l.operation_id, l.started_at,
           least(coalesce(l.ended_at, 'infinity'), w.settled_at) AS covered_until
      FROM run_ledger l
      JOIN work_item w USING (tenant_id, operation_id)
)
SELECT coalesce(max(n), 0)
  FROM (SELECT s.started_at, count(DISTINCT (r.tenant_id, r.operation_id)) AS n
          FROM runs s
          JOIN runs r ON r.started_at <= s.started_at AND s.started_at < r.covered_until
         WHERE s.started_at < s.covered_until
         GROUP BY s.started_at) AS at_start
"""


def registry_for(url: str) -> Registry:
    return ledgered_registry(url, JOB, LEASE, WORK_SECONDS)


def limited_replica(url: str) -> None:
    """One bridge process: a pool on the limited job type that drains until all succeeded."""
    timeouts = SessionTimeouts(idle_in_transaction=IDLE_IN_TRANSACTION)
    store = PostgresStore.connect(url, max_size=12, timeouts=timeouts)
    try:
        store = with_policy(store, concurrency={JOB: ConcurrencyLimit(total=LIMIT)})
        pool = WorkerPool(store, registry_for(url), HASHER, threads=4, poll_interval=0.02)
        pool.start()
        with psycopg.connect(url, autocommit=True) as conn:
            eventually(lambda: succeeded(conn) == OPERATIONS, "every row settled", DEADLINE)
        pool.stop(deadline=10)
    finally:
        store.close()


@pytest.mark.slow
def test_a_limit_of_three_holds_across_three_processes_with_a_takeover(
    store: PostgresStore, db_url: str, db: Db
) -> None:
    db.execute(LEDGER)
    registry = registry_for(db_url)
    batch = [
        for_job(registry, JOB, f"op-{i}", {"i": i}, tenant=f"t{i % 4}") for i in range(OPERATIONS)
    ]
    for start in range(0, len(batch), 500):
        store.inbox.ingest(batch[start : start + 500])

    spawn = multiprocessing.get_context("spawn")
    children = [spawn.Process(target=limited_replica, args=(db_url,)) for _ in range(PROCESSES)]
    for child in children:
        child.start()
    pids = {child.pid for child in children}
    paused: int | None = None
    try:
        # Stop a process while a run of its own is in progress (its claim held). Which one: the
        # process that settles a run claims the freed slot in the same transaction, so the
        # slots may stay with one process until it stops.
        for _ in range(100):
            eventually(lambda: running(db) in pids, "a run in progress", DEADLINE, poll=0.001)
            candidate = running(db)
            assert candidate is not None
            os.kill(candidate, signal.SIGSTOP)
            if running(db, candidate) == candidate:
                paused = candidate
                break
            os.kill(candidate, signal.SIGCONT)
        else:
            raise AssertionError("no process was ever stopped in the middle of a run")
        assert paused is not None
        # Past its lease, another process takes the row over under a higher fence.
        eventually(
            lambda: (
                count(
                    db,
                    "SELECT count(*) FROM run_ledger l"
                    "  JOIN work_item w USING (tenant_id, operation_id)"
                    " WHERE l.pid = %s AND l.ended_at IS NULL AND w.fence > l.fence",
                    paused,
                )
                > 0
            ),
            "a takeover of the paused process's run",
            DEADLINE,
        )
        os.kill(paused, signal.SIGCONT)
        eventually(lambda: succeeded(db) == OPERATIONS, "every operation succeeded", DEADLINE)
        for child in children:
            child.join(DEADLINE)
        assert [child.exitcode for child in children] == [0] * PROCESSES
    finally:
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGCONT)
                child.kill()
                child.join()

    # The guarantee, from the target's own ledger.
    assert count(db, OVERLAP) == LIMIT, "at most 3 rows ran at once, and the limit was used"
    # Takeovers happened, and the paused process ran again after its row was taken over.
    assert count(db, "SELECT count(*) FROM work_item WHERE fence > 1") > 0
    assert (
        count(
            db,
            "SELECT count(*) FROM run_ledger l JOIN work_item w USING (tenant_id, operation_id)"
            " WHERE l.pid = %s AND w.fence > l.fence AND l.ended_at IS NOT NULL",
            paused,
        )
        > 0
    )
    # Every operation succeeded exactly once: one succeeded attempt each, and the effect holds
    # the fence of the claim that settled it.
    assert count(db, "SELECT count(*) FROM work_item WHERE state <> 'succeeded'") == 0
    assert (
        count(
            db,
            f"SELECT count(*) FROM (SELECT tenant_id, operation_id FROM {ENDED_ATTEMPTS} a"
            " WHERE outcome = 'succeeded' GROUP BY 1, 2 HAVING count(*) = 1) AS once",
        )
        == OPERATIONS
    )
    assert (
        count(
            db,
            "SELECT count(*) FROM effect e JOIN work_item w USING (tenant_id, operation_id)"
            " WHERE e.fence = w.fence",
        )
        == OPERATIONS
    )
