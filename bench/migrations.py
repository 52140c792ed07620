"""Migrating a live work table: the longest claim stall while the schema moves from 1 to current.

A database at schema version 1 holds 1,000,000 terminal (``succeeded``) rows and a queue of
live ones. Worker threads claim and complete them one at a time through
:class:`~bridge.store.PostgresStore` (``claim(w, 1)``, ``complete``), each completion time
recorded by the monotonic clock, while the schema is brought up to date in one of two ways:

* ``runner``: :func:`bridge.store.migrate.migrate`, as shipped: one transaction per migration under
a
  short ``lock_timeout`` (retried with backoff), and the purge index (``work_item_terminal``)
  built ``CONCURRENTLY`` outside any transaction by 0003;
* ``one transaction``: what 0002 did as first released: the same DDL and the same index built
  by a plain ``CREATE INDEX``, all in one transaction, no lock timeout (the benchmark's own SQL:
  0002's text and 0003's statement without ``CONCURRENTLY``).

The stall is the longest time between two consecutive completions (over all threads) that
overlaps the migration; a ``baseline`` window of the same length with no migration, measured
just after, gives the machine's own noise. Each round starts from a fresh database; the arms
alternate from round to round, and the report gives the median of the rounds with min..max::

    python -m bench.migrations                 # full run: 3 rounds per arm, 1M rows
    python -m bench.migrations --quick         # smoke run: 1 round per arm, 100k rows
    python -m bench.migrations --runs 5 --database-url postgresql://...

The server is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded one. It
prints a markdown section for docs/benchmarks.md on stdout and its progress on stderr.
"""

from __future__ import annotations

import hashlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import conninfo

from bench.store import (
    admin,
    arguments,
    checkpoint,
    command_line,
    empty_database,
    facts_table,
    log,
    report_facts,
    server,
)
from bridge import sql
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.store.work import Settlement
from bridge.types import State

LEASE = timedelta(minutes=5)
RUNNER, ONE_TRANSACTION = "runner", "one transaction"
ARMS = (RUNNER, ONE_TRANSACTION)

# -- benchmark-only SQL ----------------------------------------------------------------------

FILL_HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, fence, attempts, outcome_code,
                       created_at, updated_at, next_attempt_at, claimed_at, settled_at)
SELECT 'history', 'op-' || g, 'bench', 'bench.job', 'C', sha256(g::text::bytea),
       'history:' || g, 'succeeded', 1, 1, 'ok', t, t, t, t, t
  FROM generate_series(1, %(n)s::int) AS g,
       LATERAL (SELECT now() - interval '30 days' + g * interval '1 second') AS at(t)
"""

FILL_QUEUE = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, next_attempt_at)
SELECT 'bench', 'live-' || g, 'bench', 'bench.job', 'C', sha256(g::text::bytea),
       'live:' || g, now() - interval '1 second'
  FROM generate_series(1, %(n)s::int) AS g
"""

RECORD = "INSERT INTO fencebridge_migration (version, name, checksum) VALUES (%s, %s, %s)"


@dataclass(frozen=True)
class Plan:
    runs: int
    history_rows: int
    queue_rows: int
    threads: int


FULL = Plan(runs=3, history_rows=1_000_000, queue_rows=200_000, threads=4)
QUICK = Plan(runs=1, history_rows=100_000, queue_rows=50_000, threads=4)


@dataclass
class Round:
    #: seconds the migration took
    took: float
    #: longest gap between completions overlapping the migration, and in the baseline window
    stall: float
    baseline: float
    #: completions per second during the migration, and in the baseline window
    rate: float
    baseline_rate: float


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]]
    rounds: dict[str, list[Round]] = field(default_factory=dict)

    def cell(self, arm: str, value: Callable[[Round], float], unit: str, digits: int) -> str:
        values = [value(r) for r in self.rounds.get(arm, [])]
        if not values:
            return "-"
        median = statistics.median(values)
        text = f"{median:,.{digits}f}" + (f" {unit}" if unit else "")
        if len(values) == 1:
            return text
        return f"{text} ({min(values):,.{digits}f}..{max(values):,.{digits}f})"

    def markdown(self) -> str:
        rows = [
            "## Migrations on a live table",
            "",
            *facts_table(self.facts),
            "",
            f"Schema 1 to {sql.migrations()[-1].version} under {self.plan.threads} threads "
            f"claiming and completing one row at a time, {self.plan.history_rows:,} terminal rows "
            f"in the table; median of {self.plan.runs} round(s) per arm with min..max.",
            "",
            "| arm | migration took | longest claim stall | claims/s during | "
            "baseline stall | baseline claims/s |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for arm in ARMS:
            rows.append(
                f"| {arm} | {self.cell(arm, lambda r: r.took, 's', 2)} "
                f"| {self.cell(arm, lambda r: r.stall * 1000, 'ms', 0)} "
                f"| {self.cell(arm, lambda r: r.rate, '', 0)} "
                f"| {self.cell(arm, lambda r: r.baseline * 1000, 'ms', 0)} "
                f"| {self.cell(arm, lambda r: r.baseline_rate, '', 0)} |"
            )
        return "\n".join(rows) + "\n"


# -- one round -------------------------------------------------------------------------------


def checksum(text: str) -> str:
    """As the runner records it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def at_version_one(url: str, plan: Plan) -> None:
    """Schema 1, as the first release installed it, a million terminal rows and a queue."""
    first = sql.migrations()[0]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.statement("migration_table"))
        with conn.transaction():
            conn.execute(first.sql)
            conn.execute(RECORD, (first.version, first.name, checksum(first.sql)))
    admin(
        url,
        (FILL_HISTORY, {"n": plan.history_rows}),
        (FILL_QUEUE, {"n": plan.queue_rows}),
        "VACUUM ANALYZE work_item",
    )
    checkpoint(url)


def one_transaction(conn: psycopg.Connection[Any]) -> None:
    """0002 as first released: its DDL and the purge index, built plainly, in one transaction."""
    later = sql.migrations()[1:]
    with conn.transaction():
        for migration in later:
            if migration.transactional:
                conn.execute(migration.sql)
            else:
                for statement in migration.statements():
                    conn.execute(statement.replace("CONCURRENTLY ", ""))
            conn.execute(RECORD, (migration.version, migration.name, checksum(migration.sql)))


class Claimers:
    """Threads that claim and complete one row at a time, recording each completion."""

    def __init__(self, store: PostgresStore, threads: int) -> None:
        self._store = store
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.done: list[float] = []
        self._threads = [
            threading.Thread(target=self._loop, args=(f"bench-{i}",)) for i in range(threads)
        ]

    def __enter__(self) -> Claimers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _loop(self, worker: str) -> None:
        while not self._stop.is_set():
            claims = self._store.claims.claim(worker, 1, LEASE)
            for claim in claims:
                self._store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
            with self._lock:
                self.done.extend(time.monotonic() for _ in claims)

    def window(self, start: float, end: float) -> tuple[float, float]:
        """The longest gap between completions overlapping [start, end], and the rate in it."""
        with self._lock:
            times = sorted(self.done)
        before = [t for t in times if t < start][-1:]
        inside = [t for t in times if start <= t <= end]
        after = [t for t in times if t > end][:1]
        edges = [*before, *inside, *after] or [start, end]
        gaps = [b - a for a, b in itertools.pairwise(edges)]
        if not before:
            gaps.append(edges[0] - start)
        return max(gaps, default=end - start), len(inside) / max(end - start, 1e-9)


def one_round(admin_url: str, plan: Plan, arm: str, label: str) -> Round:
    with empty_database(admin_url, label) as name:
        url = conninfo.make_conninfo(admin_url, dbname=name)
        log(f"{arm}: filling schema 1 with {plan.history_rows:,} terminal rows")
        at_version_one(url, plan)
        store = PostgresStore.connect(url, min_size=plan.threads, max_size=plan.threads)
        try:
            with (
                Claimers(store, plan.threads) as claimers,
                psycopg.connect(url, autocommit=True) as conn,
            ):
                time.sleep(1.0)  # warm: every thread claiming
                started = time.monotonic()
                if arm == RUNNER:
                    migrate(conn)
                else:
                    one_transaction(conn)
                ended = time.monotonic()
                took = ended - started
                # The baseline: a window of the same length just after, with no migration.
                base_start = ended + 0.1
                time.sleep(took + 0.3)
                stall, rate = claimers.window(started, ended)
                baseline, base_rate = claimers.window(base_start, base_start + took)
        finally:
            store.close()
    log(f"{arm}: migration {took:.2f}s, longest claim stall {stall * 1000:.0f} ms")
    return Round(took, stall, baseline, rate, base_rate)


def run(database_url: str | None, plan: Plan, argv: Sequence[str]) -> Report:
    with server(database_url) as admin_url, report_facts(admin_url, argv) as facts:
        report = Report(plan, facts)
        for i in range(plan.runs):
            order = ARMS if i % 2 == 0 else ARMS[::-1]
            for arm in order:
                label = f"mig{i}{'r' if arm == RUNNER else 't'}"
                report.rounds.setdefault(arm, []).append(one_round(admin_url, plan, arm, label))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        "bench.migrations", "The longest claim stall while a live work table is migrated."
    )
    parser.add_argument("--runs", type=int, help="rounds per arm")
    parser.add_argument("--history-rows", type=int, help="terminal rows in the table")
    args, command = command_line(parser, argv)
    plan = QUICK if args.quick else FULL
    if args.runs:
        plan = replace(plan, runs=args.runs)
    if args.history_rows:
        plan = replace(plan, history_rows=args.history_rows)
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
