"""A token rate per job type and per tenant across three processes, one of them killed mid-run.

Each process runs a worker pool of its own (its own connections, several threads) on one job
type with a rate of 100 runs a second (burst 20) and 30 a second per tenant (burst 5). The
backlog is 1,000 operations of four tenants, one of them holding 400; while it drains, the
inbox takes every operation's delivery again (replays) and 50 deliveries that change an
operation's payload (conflicts). The handler is a class B target in the same database, on its
own connection: it records each run's start in a ledger (the database clock), then writes the
effect with the store's conditional write on the fence. One process is SIGKILLed while a run
of it is in progress; past the lease, the others take its rows over.

What is asserted is the documented guarantee. The claims, at their own clock (claimed_at, what
the buckets count in): in every window [a, b], at most burst + rate * (b - a) runs started by
claims of the job type, and at most burst_per_tenant + rate_per_tenant * (b - a) of one tenant,
takeovers included (a takeover spends a token). The target's ledger: each run starts after its
claim, by at most the largest delay seen between the two, d, so its starts keep the same bound
over windows widened by d. Every operation ran and settled exactly once (one succeeded attempt,
the effect under the settling fence), the replays and conflicts ran nothing, and no attempt
was used by waiting for a token (every row's attempts are its claims: one, plus one per
takeover).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge.database import SessionTimeouts
from bridge.executors.registry import Registry
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.work import Rate, TokenRate
from bridge.types import Decision
from tests.support.attempts import ENDED_ATTEMPTS
from tests.support.deliveries import for_job
from tests.support.ledger import LEDGER, count, ledgered_registry, running, succeeded
from tests.support.policy import with_policy
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"token-rate-process-tests-secret")
JOB = "paced"
RATE, BURST = 100, 20
TENANT_RATE, TENANT_BURST = 30, 5
RATES = {
    JOB: TokenRate(
        total=Rate(RATE, 1),
        burst=BURST,
        per_tenant=Rate(TENANT_RATE, 1),
        burst_per_tenant=TENANT_BURST,
    )
}
OPERATIONS = 1000
#: one tenant holds 400 rows, three hold 200 each: the big one is held to its own rate
TENANTS = ("t0", "t0", "t1", "t2", "t0", "t3", "t0", "t1", "t2", "t3")
CONFLICTS = 50
PROCESSES = 3
WORK_SECONDS = 0.003
LEASE = timedelta(seconds=2)
IDLE_IN_TRANSACTION = timedelta(seconds=3)
DEADLINE = 120.0
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)


def registry_for(url: str) -> Registry:
    return ledgered_registry(url, JOB, LEASE, WORK_SECONDS)


def paced_replica(url: str) -> None:
    """One bridge process: a pool on the rate-limited job type that drains until all settled."""
    timeouts = SessionTimeouts(idle_in_transaction=IDLE_IN_TRANSACTION)
    store = PostgresStore.connect(url, max_size=12, timeouts=timeouts)
    try:
        store = with_policy(store, rates=RATES)
        pool = WorkerPool(store, registry_for(url), HASHER, threads=4, poll_interval=0.02)
        pool.start()
        with psycopg.connect(url, autocommit=True) as conn:
            eventually(lambda: succeeded(conn) == OPERATIONS, "every row settled", DEADLINE)
        pool.stop(deadline=10)
    finally:
        store.close()


def micros(at: datetime) -> int:
    """A database time in whole microseconds (its own resolution), for exact arithmetic."""
    return (at - EPOCH) // timedelta(microseconds=1)


def excess(times: list[int], rate: int, burst: int, slack: int = 0) -> int:
    """The most by which the events at ``times`` (microseconds) exceed
    burst + rate * (b - a + slack) in a window [a, b], in millionths of a run: at most 0 when
    they keep the bound. Over sorted times, the events from the i-th to the j-th lie in
    [t_i, t_j]: (j - i + 1) - rate * (t_j - t_i) - burst, whose largest value over i <= j is
    found in one pass. Integers throughout: the bound is checked exactly."""
    worst: int | None = None
    lowest: int | None = None  # min over i <= j of (i * 10^6 - rate * t_i)
    for j, t in enumerate(sorted(times)):
        here = j * 1_000_000 - rate * t
        lowest = here if lowest is None else min(lowest, here)
        found = (here + 1_000_000) - lowest - burst * 1_000_000 - rate * slack
        worst = found if worst is None else max(worst, found)
    assert worst is not None
    return worst


@pytest.mark.slow
def test_a_token_rate_holds_across_three_processes_with_a_kill_and_takeovers(
    store: PostgresStore, db_url: str, db: Db
) -> None:
    db.execute(LEDGER)
    store = with_policy(store, rates=RATES)
    registry = registry_for(db_url)
    batch = [
        for_job(registry, JOB, f"op-{i}", {"i": i}, tenant=TENANTS[i % len(TENANTS)])
        for i in range(OPERATIONS)
    ]
    for start in range(0, len(batch), 500):
        store.inbox.ingest(batch[start : start + 500])

    spawn = multiprocessing.get_context("spawn")
    children = [spawn.Process(target=paced_replica, args=(db_url,)) for _ in range(PROCESSES)]
    for child in children:
        child.start()
    pids = {child.pid for child in children}
    decisions: dict[Decision, int] = defaultdict(int)
    killed: int | None = None
    try:
        # While it drains, the inbox takes every delivery again, and some with another payload.
        for start in range(0, len(batch), 250):
            for result in store.inbox.ingest(batch[start : start + 250]):
                decisions[result.decision] += 1
        conflicting = [
            for_job(
                registry, JOB, f"op-{i}", {"i": i, "changed": 1}, tenant=TENANTS[i % len(TENANTS)]
            )
            for i in range(0, OPERATIONS, OPERATIONS // CONFLICTS)
        ]
        for result in store.inbox.ingest(conflicting):
            decisions[result.decision] += 1

        # Rows held back by the rate show as waiting for `rate`.
        eventually(
            lambda: any(w.reason == "rate" for w in store.operator.waiting()),
            "rows waiting for a token",
            DEADLINE,
            poll=0.01,
        )

        # Kill a process while a run of its own is in progress (its claim held): the process
        # the poll saw, not a second read's (that run may have ended in between).
        seen: list[int] = []

        def a_run_in_progress() -> bool:
            pid = running(db)
            if pid in pids:
                assert pid is not None
                seen.append(pid)
                return True
            return False

        eventually(a_run_in_progress, "a run in progress", DEADLINE, poll=0.001)
        killed = seen[-1]
        os.kill(killed, signal.SIGKILL)
        # Past its lease, another process takes its rows over under a higher fence.
        eventually(
            lambda: count(db, "SELECT count(*) FROM work_item WHERE fence > 1") > 0,
            "a takeover of the killed process's run",
            DEADLINE,
        )
        eventually(lambda: succeeded(db) == OPERATIONS, "every operation succeeded", DEADLINE)
        for child in children:
            child.join(DEADLINE)
        assert sorted(child.exitcode or 0 for child in children) == [-signal.SIGKILL, 0, 0]
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()

    assert decisions == {Decision.REPLAY: OPERATIONS, Decision.CONFLICT: CONFLICTS}

    # Every claim, at the database's clock: one ended attempt each (taken over or settled).
    claims = [
        (tenant, micros(at))
        for tenant, at in db.execute(
            f"SELECT a.tenant_id, a.started_at FROM {ENDED_ATTEMPTS} a WHERE a.kind = 'claim'"
        ).fetchall()
    ]
    assert len(claims) == count(db, "SELECT sum(fence) FROM work_item")
    assert excess([t for _, t in claims], RATE, BURST) <= 0
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for tenant, t in claims:
        by_tenant[tenant].append(t)
    for tenant, times in by_tenant.items():
        assert excess(times, TENANT_RATE, TENANT_BURST) <= 0, tenant

    # The target's ledger: each start follows its claim by at most d.
    starts = [
        (tenant, micros(started), micros(started) - micros(claimed))
        for tenant, started, claimed in db.execute(
            "SELECT l.tenant_id, l.started_at, a.started_at"
            "  FROM run_ledger l"
            f"  JOIN {ENDED_ATTEMPTS} a ON a.tenant_id = l.tenant_id"
            "   AND a.operation_id = l.operation_id AND a.fence = l.fence AND a.kind = 'claim'"
        ).fetchall()
    ]
    assert len(starts) == count(db, "SELECT count(*) FROM run_ledger")
    d = max(delay for _, _, delay in starts)
    assert min(delay for _, _, delay in starts) >= 0
    assert excess([t for _, t, _ in starts], RATE, BURST, slack=d) <= 0
    for tenant in by_tenant:
        tenant_starts = [t for who, t, _ in starts if who == tenant]
        assert excess(tenant_starts, TENANT_RATE, TENANT_BURST, slack=d) <= 0

    # Takeovers happened, of the killed process's runs.
    taken_over = count(
        db,
        "SELECT count(*) FROM run_ledger l JOIN work_item w USING (tenant_id, operation_id)"
        " WHERE l.pid = %s AND w.fence > l.fence",
        killed,
    )
    assert taken_over > 0
    # No attempt was used by waiting: a row's attempts are its claims, one plus one per
    # takeover (each recorded as lease_lost), whatever it waited for a token.
    assert (
        count(
            db,
            "SELECT count(*) FROM work_item w"
            " WHERE w.attempts <> w.fence OR w.fence <> 1 + (SELECT count(*) FROM work_attempt a"
            "   WHERE a.tenant_id = w.tenant_id AND a.operation_id = w.operation_id"
            "     AND a.outcome = 'lease_lost')",
        )
        == 0
    )
    # Every operation ran and settled exactly once: one succeeded attempt each, the effect under
    # the settling fence; the conflicting deliveries are recorded, never run.
    assert (
        count(
            db,
            f"SELECT count(*) FROM (SELECT tenant_id, operation_id FROM {ENDED_ATTEMPTS} a"
            " WHERE outcome = 'succeeded' GROUP BY 1, 2 HAVING count(*) = 1) AS once",
        )
        == OPERATIONS
    )
    assert (
        count(db, f"SELECT count(*) FROM {ENDED_ATTEMPTS} a WHERE outcome = 'succeeded'")
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
    assert count(db, "SELECT count(*) FROM rejected_delivery") == CONFLICTS
