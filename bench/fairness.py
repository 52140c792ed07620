"""A quiet tenant beside another tenant's backlog: claim waits with and without tenant fairness.

One tenant (the flood) has ``--backlog`` rows queued (50,000) when a worker pool starts
draining them (16 threads, a no-op class B handler, the store opened as ``fencebridge run``
opens it). Once the pool is under way, a quiet tenant writes ``--quiet`` operations, one every
few milliseconds, through the store's ingest as a consumer would. Each round runs once with
``[bridge] tenant_fairness`` on and once off, alternating which goes first, each on a database
of its own.

Reported, by the database clock (``created_at`` to ``claimed_at`` of each row, read after
``ANALYZE``): the quiet tenant's claim waits (median, 99th percentile, longest), the flood rows
claimed between a quiet row's write and its claim (the rows that overtook it), and the flood's
own claim rate over the same span. What fairness should show: the quiet rows wait as long as
one claim, not as long as the backlog::

    python -m bench.fairness                  # 3 rounds, 50,000-row backlog, 200 quiet rows
    python -m bench.fairness --quick          # 1 round, 10,000 and 50
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from bench.store import (
    arguments,
    bench_database,
    cell,
    command_line,
    facts_table,
    log,
    planned,
    report_facts,
    server,
)
from bench.workers import JOB_TYPE, Noop
from bridge.executors.registry import Registry
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.types import Delivery, TargetClass

THREADS = 16
#: how far the pool drains the backlog before the quiet tenant starts writing
HEAD_START = 1000
#: a round may not take longer than this
ROUND_TIMEOUT = 1800.0

BACKLOG = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref)
SELECT 'flood', 'flood-' || g, 'bench', %(job)s, 'B', sha256(g::text::bytea), 'none:' || g
  FROM generate_series(1, %(rows)s::int) AS g
"""

CLAIMED = "SELECT count(*) FROM work_item WHERE tenant_id = %s AND fence > 0"

#: per quiet row: its claim wait (ms) and the flood rows claimed between its write and its claim
QUIET = """
SELECT 1000 * extract(epoch FROM q.claimed_at - q.created_at),
       (SELECT count(*) FROM work_item f
         WHERE f.tenant_id = 'flood'
           AND f.claimed_at > q.created_at AND f.claimed_at < q.claimed_at)
  FROM work_item q
 WHERE q.tenant_id = 'quiet'
"""

#: the flood's claims per second while the quiet tenant was being written and claimed
FLOOD_RATE = """
SELECT count(*) / nullif(extract(epoch FROM max(f.claimed_at) - min(f.claimed_at)), 0)
  FROM work_item f
 WHERE f.tenant_id = 'flood'
   AND f.claimed_at BETWEEN (SELECT min(created_at) FROM work_item WHERE tenant_id = 'quiet')
                        AND (SELECT max(claimed_at) FROM work_item WHERE tenant_id = 'quiet')
"""


@dataclass(frozen=True)
class Plan:
    runs: int
    backlog: int
    quiet: int


FULL = Plan(runs=3, backlog=50_000, quiet=200)
QUICK = Plan(runs=1, backlog=10_000, quiet=50)


@dataclass(frozen=True)
class Round:
    fair: bool
    waits_ms: list[float]
    overtaken: list[int]
    flood_rate: float


def quiet_delivery(n: int) -> Delivery:
    return Delivery(
        tenant_id="quiet",
        operation_id=f"quiet-{n}",
        subscription="bench",
        job_type=JOB_TYPE,
        target_class=TargetClass.B,
        payload=b"{}",
    )


def one_round(url: str, plan: Plan, *, fair: bool) -> Round:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BACKLOG, {"job": JOB_TYPE, "rows": plan.backlog})
        conn.execute("VACUUM ANALYZE work_item")
        conn.execute("CHECKPOINT")
    size = THREADS + 3
    store = PostgresStore.connect(
        url,
        min_size=size,
        max_size=size,
        generic_plans=True,
        policy=ClaimPolicy(fairness={} if fair else None),
    )
    try:
        store.pool.wait()
        registry = Registry()
        registry.register(JOB_TYPE, Noop())
        pool = WorkerPool(store, registry, IdentityHasher.ephemeral(), worker_id="bench")
        with psycopg.connect(url, autocommit=True) as conn:

            def claimed(tenant: str) -> int:
                found = conn.execute(CLAIMED, (tenant,)).fetchone()
                return int(found[0]) if found else 0

            pool.start()
            ends = time.monotonic() + ROUND_TIMEOUT
            while claimed("flood") < HEAD_START:
                if time.monotonic() > ends:
                    raise RuntimeError("the pool never drained the backlog")
                time.sleep(0.05)
            for n in range(plan.quiet):
                store.inbox.ingest([quiet_delivery(n)])
                time.sleep(0.005)
            while claimed("quiet") < plan.quiet:
                if time.monotonic() > ends:
                    raise RuntimeError("the quiet rows were never all claimed")
                time.sleep(0.05)
            pool.stop()
            conn.execute("ANALYZE work_item")
            rows = conn.execute(QUIET).fetchall()
            rate = conn.execute(FLOOD_RATE).fetchone()
    finally:
        store.close()
    return Round(
        fair,
        [float(w) for w, _ in rows],
        [int(n) for _, n in rows],
        float(rate[0] or 0) if rate else 0.0,
    )


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [
            f"{self.plan.runs} round(s): a {self.plan.backlog:,}-row backlog of one tenant, "
            f"{self.plan.quiet} operations of a quiet tenant written one every 5 ms once "
            f"{HEAD_START:,} backlog rows were claimed; one pool of {THREADS} threads. Per "
            "round, medians over the quiet rows; across rounds, the median round with the "
            "others' range.",
            "",
            *facts_table(self.facts),
            "",
            "| tenant fairness | quiet: claim wait p50 ms | p99 ms | longest ms "
            "| backlog rows that overtook a quiet row: p50 | max | backlog claims/s meanwhile |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for fair in (True, False):
            rounds = [r for r in self.rounds if r.fair is fair]
            if not rounds:
                continue
            lines.append(
                f"| {'on' if fair else 'off'} "
                f"| {cell([statistics.median(r.waits_ms) for r in rounds])} "
                f"| {cell([_p99(r.waits_ms) for r in rounds])} "
                f"| {cell([max(r.waits_ms) for r in rounds])} "
                f"| {cell([statistics.median(r.overtaken) for r in rounds])} "
                f"| {cell([max(r.overtaken) for r in rounds])} "
                f"| {cell([r.flood_rate for r in rounds])} |"
            )
        return "\n".join(lines) + "\n"


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run(database_url: str | None, plan: Plan, argv: list[str]) -> Report:
    report = Report(plan)
    with server(database_url) as admin_url, report_facts(admin_url, argv) as facts:
        report.facts = facts
        for k in range(plan.runs):
            for fair in (True, False) if k % 2 == 0 else (False, True):
                with bench_database(admin_url, "fairness") as url:
                    result = one_round(url, plan, fair=fair)
                log(
                    f"round {k + 1}, fairness {'on' if fair else 'off'}: quiet wait p50 "
                    f"{statistics.median(result.waits_ms):,.0f} ms, overtaken max "
                    f"{max(result.overtaken):,}"
                )
                report.rounds.append(result)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.fairness", "A quiet tenant beside a backlog, fairness on and off.")
    parser.add_argument("--runs", type=int, help="rounds (each runs fairness on and off)")
    parser.add_argument("--backlog", type=int, help="the flooding tenant's queued rows")
    parser.add_argument("--quiet", type=int, help="the quiet tenant's operations")
    args, command = command_line(parser, argv)
    plan = planned(QUICK if args.quick else FULL, args, ("runs", "backlog", "quiet"))
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
