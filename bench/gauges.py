"""The database gauges' reading as the history grows: every row counted, or the open ones only.

Every replica of the bridge reads its database gauges every 15 seconds
(:meth:`bridge.telemetry.Telemetry.observe`). One database holds a backlog (``--queued`` rows
queued, a few hundred claimed, some of them with expired leases, and parked rows) and a history
of terminal rows that grows, step by step, to each of ``--sizes``; at each size, after
``VACUUM ANALYZE``, the two readings alternate ``--runs`` times through a store opened as
``fencebridge run`` opens it (one plan per statement):

* ``every row``: :meth:`~bridge.store.PostgresStore.stats`, the count by subscription, tenant
  and state of the whole table (``stats_counts.sql``), which the gauges read until they read
  the open rows only, and which ``fencebridge status`` reads on an operator's command;
* ``open and parked``: :meth:`~bridge.store.PostgresStore.open_stats`, what the gauges read
  (``stats_open.sql``: queued, claimed and parked rows, each through its partial index).

Both add the stalled claims, the oldest unknown and the rejected deliveries (``stats_health``)
and the waiting rows (``waiting.sql``), as the gauges' refresh does::

    python -m bench.gauges                         # 500,000, 1 and 2 million rows, 5 runs each
    python -m bench.gauges --quick                 # 100,000 and 200,000 rows, 3 runs
    python -m bench.gauges --sizes 1000000 --runs 9 --database-url postgresql://...

The server is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded one. It
prints a markdown section for docs/benchmarks.md on stdout and its progress on stderr.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.store import (
    admin,
    arguments,
    bench_database,
    command_line,
    facts_table,
    log,
    report_facts,
    server,
)
from bridge.store import PostgresStore
from bridge.types import Stats

EVERY_ROW, OPEN_ONLY = "every row", "open and parked"
ARMS = (EVERY_ROW, OPEN_ONLY)

# -- benchmark-only SQL ----------------------------------------------------------------------

#: terminal rows numbered from %(first)s to %(last)s, over 50 tenants and two subscriptions
GROW_HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, fence, attempts, outcome_code,
                       created_at, updated_at, next_attempt_at, claimed_at, settled_at)
SELECT 't' || (g %% 50), 'done-' || g, CASE WHEN g %% 3 = 0 THEN 'refunds' ELSE 'orders' END,
       'refund', 'B', sha256(g::text::bytea), 'history:' || g,
       CASE WHEN g %% 97 = 0 THEN 'failed_terminal' ELSE 'succeeded' END, 1, 1, 'ok',
       t, t, t, t, t
  FROM generate_series(%(first)s::int, %(last)s::int) AS g,
       LATERAL (SELECT now() - interval '30 days' + g * interval '1 millisecond') AS at(t)
"""

#: the backlog: queued rows, claimed ones (a tenth of them with expired leases), parked ones
BACKLOG = (
    """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref)
SELECT 't' || (g %% 50), 'open-' || g, 'orders', 'refund', 'B', sha256(g::text::bytea),
       'open:' || g
  FROM generate_series(1, %(queued)s::int) AS g
""",
    """
UPDATE work_item
   SET state = 'claimed', fence = 1, attempts = 1, lease_owner = 'w', claimed_at = now(),
       lease_expires_at = now() + CASE WHEN substr(operation_id, 6)::int <= 30
                                       THEN interval '-1 minute' ELSE interval '1 hour' END
 WHERE operation_id LIKE 'open-%' AND substr(operation_id, 6)::int <= 300
""",
    """
UPDATE work_item
   SET state = CASE WHEN substr(operation_id, 6)::int % 2 = 0 THEN 'unknown'
                    ELSE 'quarantined' END,
       fence = 1, attempts = 1, settled_at = now(), outcome_code = 'parked'
 WHERE operation_id LIKE 'open-%' AND substr(operation_id, 6)::int BETWEEN 301 AND 400
""",
)


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    runs: int
    queued: int


FULL = Plan(sizes=(500_000, 1_000_000, 2_000_000), runs=5, queued=10_000)
QUICK = Plan(sizes=(100_000, 200_000), runs=3, queued=2_000)


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]]
    #: (size, arm) -> seconds per reading
    took: dict[tuple[int, str], list[float]] = field(default_factory=dict)

    def cell(self, size: int, arm: str) -> str:
        values = [t * 1000 for t in self.took.get((size, arm), [])]
        if not values:
            return "-"
        text = f"{statistics.median(values):,.1f} ms"
        return text + (f" ({min(values):,.1f}..{max(values):,.1f})" if len(values) > 1 else "")

    def markdown(self) -> str:
        rows = [
            "## Database gauges as the history grows",
            "",
            *facts_table(self.facts),
            "",
            f"One reading of the gauges (the counts, the stalled claims, the oldest unknown, the "
            f"rejected deliveries and the waiting rows) beside a backlog of {self.plan.queued:,} "
            f"open and parked rows, through a store opened as `fencebridge run` opens it; median "
            f"of {self.plan.runs} alternating runs per arm with min..max.",
            "",
            "| terminal rows | every row (`stats_counts`) | open and parked (`stats_open`) |",
            "| --- | --- | --- |",
        ]
        rows += [
            f"| {size:,} | {self.cell(size, EVERY_ROW)} | {self.cell(size, OPEN_ONLY)} |"
            for size in self.plan.sizes
        ]
        return "\n".join(rows) + "\n"


def reading(store: PostgresStore, arm: str) -> Callable[[], object]:
    counts: Callable[[], Stats] = (
        store.operator.stats if arm == EVERY_ROW else store.operator.open_stats
    )

    def read() -> object:
        return counts(), store.operator.waiting()

    return read


def run(database_url: str | None, plan: Plan, argv: Sequence[str]) -> Report:
    with (
        server(database_url) as admin_url,
        report_facts(admin_url, argv) as facts,
        bench_database(admin_url, "gauges") as url,
    ):
        report = Report(plan, facts)
        insert, claimed, parked = BACKLOG
        admin(url, (insert, {"queued": plan.queued}), claimed, parked)
        store = PostgresStore.connect(url, min_size=1, max_size=1, generic_plans=True)
        try:
            filled = 0
            for size in plan.sizes:
                log(f"growing the history to {size:,} terminal rows")
                admin(url, (GROW_HISTORY, {"first": filled + 1, "last": size}))
                admin(url, "VACUUM ANALYZE work_item")
                filled = size
                for i in range(plan.runs):
                    for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                        read = reading(store, arm)
                        started = time.perf_counter()
                        read()
                        took = time.perf_counter() - started
                        report.took.setdefault((size, arm), []).append(took)
                log(
                    f"{size:,} rows: every row {report.cell(size, EVERY_ROW)}, "
                    f"open and parked {report.cell(size, OPEN_ONLY)}"
                )
        finally:
            store.close()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.gauges", "The database gauges' reading as the history grows.")
    parser.add_argument("--runs", type=int, help="readings per arm and size")
    parser.add_argument("--sizes", type=int, nargs="+", help="terminal rows at each step")
    parser.add_argument("--queued", type=int, help="queued rows in the backlog")
    args, command = command_line(parser, argv)
    plan = QUICK if args.quick else FULL
    if args.runs:
        plan = replace(plan, runs=args.runs)
    if args.sizes:
        plan = replace(plan, sizes=tuple(sorted(args.sizes)))
    if args.queued:
        plan = replace(plan, queued=args.queued)
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
