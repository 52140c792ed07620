"""The worker tier's statements on plans made from a drained table's statistics.

The bridge's connections plan each statement once (``force_generic_plan``) from the statistics
of the moment, and keep the plan. This measures the statements a pool runs (a tenant-fair claim
of 8 rows, a heartbeat of those 8, a heartbeat of one, their batch settlement), each round on a
database of its own holding ``--terminal`` settled rows (20,000), ``--queued`` rows queued
(10,000) and ``--claimed`` rows claimed by other workers with leases that hold (5,000), with the
statistics taken at one of two moments:

* ``fresh``: ANALYZE after the open rows were written, as autovacuum would have it sooner or
  later;
* ``drained``: ANALYZE while every row was terminal (a queue that had drained, the open rows
  written since), as a bridge sees it until the next ANALYZE.

Reported: the median time of each statement, by the client's clock, over ``--repeat`` rounds
of the four (300), per arm. Bounded plans take about the same in both arms::

    python -m bench.plans                 # 3 rounds
    python -m bench.plans --quick         # 1 round, smaller tables
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

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
from bench.workers import JOB_TYPE
from bridge.store import PostgresStore, Settlement
from bridge.store.claims import ClaimPolicy
from bridge.types import Claim, State

LEASE = timedelta(minutes=5)
CLAIM = 8
STEPS = ("claim", "heartbeat_many", "heartbeat", "settle_many")
ARMS = ("fresh", "drained")

ROWS = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, settled_at)
SELECT 'bench', %(prefix)s || g, 'bench', %(job)s, 'B', sha256((%(prefix)s || g)::bytea),
       'none:' || g, %(state)s, CASE WHEN %(state)s = 'succeeded' THEN now() END
  FROM generate_series(1, %(rows)s::int) AS g
"""
HOLD = """
UPDATE work_item
   SET state = 'claimed', fence = 1, attempts = 1, lease_owner = 'other',
       lease_expires_at = now() + interval '1 hour', claimed_at = now()
 WHERE (tenant_id, operation_id) IN (SELECT tenant_id, operation_id FROM work_item
                                      WHERE state = 'queued' ORDER BY seq DESC
                                      LIMIT %(rows)s)
"""


@dataclass(frozen=True)
class Plan:
    runs: int
    terminal: int
    queued: int
    claimed: int
    repeat: int


FULL = Plan(runs=3, terminal=20_000, queued=10_000, claimed=5_000, repeat=300)
QUICK = Plan(runs=1, terminal=5_000, queued=2_000, claimed=1_000, repeat=100)


def one_round(url: str, plan: Plan, arm: str) -> dict[str, float]:
    """Median milliseconds of each statement, for one arm on one database."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = {"job": JOB_TYPE, "prefix": "done-", "state": "succeeded", "rows": plan.terminal}
        conn.execute(ROWS, rows)
        if arm == "drained":
            conn.execute("ANALYZE work_item")
        conn.execute(ROWS, {**rows, "prefix": "open-", "state": "queued", "rows": plan.queued})
        conn.execute(HOLD, {"rows": plan.claimed})
        if arm == "fresh":
            conn.execute("ANALYZE work_item")
        conn.execute("CHECKPOINT")
    store = PostgresStore.connect(
        url, min_size=1, max_size=1, generic_plans=True, policy=ClaimPolicy(fairness={})
    )
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    try:
        for _ in range(plan.repeat):
            claimed: list[Claim] = []
            for step, action in _steps(store, claimed).items():
                started = time.perf_counter()
                action()
                times[step].append(time.perf_counter() - started)
    finally:
        store.close()
    return {step: 1000 * statistics.median(values) for step, values in times.items()}


def _steps(store: PostgresStore, claimed: list[Claim]) -> dict[str, Callable[[], object]]:
    """One round's statements, in order: the claim fills ``claimed`` for the others."""
    return {
        "claim": lambda: claimed.extend(
            store.claims.claim("bench", CLAIM, LEASE, job_types=[JOB_TYPE])
        ),
        "heartbeat_many": lambda: store.settle.heartbeat_many([c.ticket for c in claimed], LEASE),
        "heartbeat": lambda: store.settle.heartbeat(claimed[0].ticket, LEASE),
        "settle_many": lambda: store.settle.settle_many(
            [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed]
        ),
    }


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    rounds: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def markdown(self) -> str:
        p = self.plan
        lines = [
            f"{p.runs} round(s) per arm: {p.terminal:,} settled rows, {p.queued:,} queued, "
            f"{p.claimed:,} claimed by other workers; the store as `fencebridge run` opens it "
            f"(one plan per statement, tenant fairness on); {p.repeat} rounds of the four "
            "statements per database. Median ms per statement; across rounds, the median "
            "round with the others' range.",
            "",
            *facts_table(self.facts),
            "",
            "| statistics taken | claim of 8 | heartbeat of 8 | heartbeat of 1 | settlement of 8 |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for arm in ARMS:
            rounds = self.rounds.get(arm, [])
            if rounds:
                cells = " | ".join(cell([r[step] for r in rounds], digits=2) for step in STEPS)
                lines.append(f"| {arm} | {cells} |")
        return "\n".join(lines) + "\n"


def run(database_url: str | None, plan: Plan, argv: list[str]) -> Report:
    report = Report(plan)
    with server(database_url) as admin_url, report_facts(admin_url, argv) as facts:
        report.facts = facts
        for k in range(plan.runs):
            for arm in ARMS if k % 2 == 0 else tuple(reversed(ARMS)):
                with bench_database(admin_url, "plans") as url:
                    result = one_round(url, plan, arm)
                log(f"round {k + 1}, {arm}: " + ", ".join(f"{s} {result[s]:.2f} ms" for s in STEPS))
                report.rounds.setdefault(arm, []).append(result)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.plans", "The pool's statements on a drained table's statistics.")
    parser.add_argument("--runs", type=int, help="rounds (each runs both arms)")
    parser.add_argument("--terminal", type=int, help="settled rows")
    parser.add_argument("--queued", type=int, help="queued rows")
    parser.add_argument("--claimed", type=int, help="of the queued rows, how many are claimed")
    parser.add_argument("--repeat", type=int, help="rounds of the four statements per database")
    args, command = command_line(parser, argv)
    plan = planned(
        QUICK if args.quick else FULL, args, ("runs", "terminal", "queued", "claimed", "repeat")
    )
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
