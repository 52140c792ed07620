"""Work store throughput: the library beside the same SQL run raw through psycopg.

Two arms are measured against the same database in alternation: ``library`` goes through
:class:`~bridge.store.PostgresStore`; ``raw`` runs the very same statement text
(``bridge.sql.statement(name)``) with the same parameters on plain autocommit psycopg
connections, one per thread. The ratio library/raw is therefore the cost of the library's own
code (pool, parameter building, result objects), not of the SQL.

A shared two-core machine is noisy, so each round alternates the arms in short slices
(A/B, then B/A, ...), and each arm's rate is its rows over its own time: both arms see the same
background load. Every round starts from a freshly filled queue; the report gives the median of
the rounds and the median of the per-round ratios. Beside the rates it gives the client CPU
per row (this process only), which the noise disturbs much less than the wall clock.

What is measured:

* ``ingest``: rows/s for batches of 10 new deliveries (``ingest`` vs ``ingest_batch``,
  one statement with its check, as the store sends it), at 1 and 4 threads.
* ``claim``: claim + complete, rows/s, single (claim 1, complete 1) and batched (claim 10,
  complete_many 10), at 1, 4 and 16 worker threads.
* ``history``: claim + complete in a database holding 1M terminal (``succeeded``) rows beside
  one holding none, interleaved the same way, and the slowdown; then the cost of a claim of 10
  and of completing them inside the server (``EXPLAIN (ANALYZE, BUFFERS)``) in both.
* ``attempts``: claim + complete through the library with the attempt history on (the default
  ``attempt_history``) beside off (``0``), both arms on one database and one queue,
  interleaved the same way, and the slowdown.

The benchmark creates its own databases on the server and drops them at the end. The server is
``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded one it starts. It prints
a markdown report for docs/benchmarks.md on stdout and its progress on stderr::

    python -m bench.store                      # full run, under 10 minutes
    python -m bench.store --quick              # smoke run, under a minute
    python -m bench.store --only claim --runs 5 --database-url postgresql://...

The setup statements here (bulk fills, resets, VACUUM, EXPLAIN) are the benchmark's own, not
the store's. The other benchmarks share this one's scaffolding: the server, their databases,
the report's header facts and the command line.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo
from psycopg import sql as pgsql
from psycopg.rows import TupleRow

from bridge import embedded, sql
from bridge.database import DATABASE_URL_ENV
from bridge.store import PostgresStore
from bridge.store.ingest import insert_params
from bridge.store.migrate import migrate
from bridge.store.work import ATTEMPT_HISTORY_DEFAULT, Settlement
from bridge.types import Delivery, State, TargetClass

Connection = psycopg.Connection[TupleRow]
#: one unit of work of one thread: returns the rows it moved; 0 means "nothing left"
Step = Callable[[], int]
#: an arm is one step per thread
Arm = Sequence[Step]
K = TypeVar("K")
#: a benchmark's plan (a dataclass of its sizes), as `planned` returns it
PlanT = TypeVar("PlanT")

LEASE = timedelta(minutes=5)
INGEST_BATCH = 10
CLAIM_BATCH = 10
BODY = b'{"amount": 1250, "currency": "EUR", "note": "' + b"x" * 200 + b'"}'
LIBRARY, RAW = "library", "raw"
NONE, HISTORY = "none", "history"
ON, OFF = "on", "off"
SECTIONS = ("ingest", "claim", "history", "attempts")
PG_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_level",
    "full_page_writes",
    "max_wal_size",
    "checkpoint_timeout",
    "work_mem",
    "effective_cache_size",
    "random_page_cost",
    "autovacuum",
    "max_connections",
    "jit",
)

# -- benchmark-only SQL ----------------------------------------------------------------------

RESET = """
DELETE FROM work_item WHERE tenant_id <> 'history';
DELETE FROM payload WHERE tenant_id IS DISTINCT FROM 'history';
TRUNCATE rejected_delivery;
"""

FILL_QUEUE_PAYLOAD = """
INSERT INTO payload (payload_ref, tenant_id, body)
SELECT %(run)s::text || ':' || g, 'bench', %(body)s::bytea
  FROM generate_series(1, %(n)s::int) AS g
"""

FILL_QUEUE = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, next_attempt_at)
SELECT 'bench', %(run)s::text || '-' || g, 'bench', 'bench.job', 'C',
       sha256(%(body)s::bytea), %(run)s::text || ':' || g, now() - interval '1 second'
  FROM generate_series(1, %(n)s::int) AS g
"""

FILL_HISTORY_PAYLOAD = """
INSERT INTO payload (payload_ref, tenant_id, body)
SELECT 'history:' || g, 'history', %(body)s::bytea
  FROM generate_series(1, %(n)s::int) AS g
"""

FILL_HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, fence, attempts, outcome_code,
                       created_at, updated_at, next_attempt_at, claimed_at, settled_at)
SELECT 'history', 'op-' || g, 'bench', 'bench.job', 'C',
       sha256(%(body)s::bytea), 'history:' || g, 'succeeded', 1, 1, 'ok',
       t, t, t, t, t
  FROM generate_series(1, %(n)s::int) AS g,
       LATERAL (SELECT now() - interval '30 days' + g * interval '1 second') AS at(t)
"""

VACUUM = "VACUUM ANALYZE work_item, payload"

# The broker benchmarks start each round from an empty work table and count its rows.
EMPTY_WORK = "TRUNCATE work_item, payload, rejected_delivery CASCADE"
WORK_ROWS = "SELECT count(*) FROM work_item"
SUCCEEDED_ROWS = "SELECT count(*) FROM work_item WHERE state = 'succeeded'"

# The claim ran under EXPLAIN, which returns the plan, not the rows: find them by lease owner.
CLAIMED_BY = """
SELECT tenant_id, operation_id, fence
  FROM work_item
 WHERE state = 'claimed' AND lease_owner = %(worker)s
"""

# -- plans -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    runs: int
    #: seconds each arm runs per round, split into ``slices`` alternating slices
    seconds: float
    slices: int
    threads: tuple[int, ...]
    ingest_threads: tuple[int, ...]
    history_threads: int
    history_rows: int
    #: more rounds here: the slowdown is a small difference between two noisy rates
    history_runs: int
    #: EXPLAIN (ANALYZE, BUFFERS) runs per statement and database
    explain_runs: int
    #: deliveries prepared per arm and round for ingest (split over the threads)
    ingest_rows: int
    #: rows queued per arm and round for a claim measurement; more when an earlier round
    #: moved over a third of that, or ran dry (the load on a shared machine swings 3x)
    queue_single: int
    queue_batch: int

    def queue_rows(self, batch: int) -> int:
        return self.queue_single if batch == 1 else self.queue_batch


FULL = Plan(
    runs=3,
    seconds=3.0,
    slices=6,
    threads=(1, 4, 16),
    ingest_threads=(1, 4),
    history_threads=4,
    history_rows=1_000_000,
    history_runs=7,
    explain_runs=51,
    ingest_rows=40_000,
    queue_single=5_000,
    queue_batch=30_000,
)
QUICK = Plan(
    runs=1,
    seconds=1.0,
    slices=2,
    threads=(1, 4),
    ingest_threads=(1,),
    history_threads=4,
    history_rows=20_000,
    history_runs=1,
    explain_runs=5,
    ingest_rows=15_000,
    queue_single=4_000,
    queue_batch=15_000,
)

# -- results ---------------------------------------------------------------------------------


@dataclass
class Sample:
    rows: int = 0
    seconds: float = 0.0
    #: CPU seconds this process spent (all its threads) while the arm ran
    cpu: float = 0.0
    #: the queue ran dry before the time was up
    drained: bool = False

    def add(self, other: Sample) -> None:
        self.rows += other.rows
        self.seconds += other.seconds
        self.cpu += other.cpu
        self.drained = self.drained or other.drained

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_row(self) -> float:
        """Client CPU microseconds per row."""
        return self.cpu / self.rows * 1e6 if self.rows else 0.0


@dataclass
class Series:
    """One arm's samples, one per round."""

    samples: list[Sample] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [s.rate for s in self.samples]

    def rate_cell(self) -> str:
        rates = self.rates
        text = f"{statistics.median(rates):,.0f}"
        if len(rates) > 1:
            text += f" ({min(rates):,.0f}..{max(rates):,.0f})"
        return text + ("*" if any(s.drained for s in self.samples) else "")

    def cpu_cell(self) -> str:
        return f"{statistics.median(s.cpu_per_row for s in self.samples):,.0f}"


def ratio(a: Series, b: Series) -> float:
    """Median over rounds of a/b; both arms of a round ran interleaved, so drift cancels."""
    return statistics.median(x / y for x, y in zip(a.rates, b.rates, strict=True) if y > 0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- databases -------------------------------------------------------------------------------


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """An admin URL: the one given, else the environment's, else an embedded server."""
    url = url or os.environ.get(DATABASE_URL_ENV)
    if url:
        yield url
        return
    log("no database URL: starting an embedded PostgreSQL")
    pg = embedded.start()
    try:
        yield pg.url
    finally:
        pg.stop()
        shutil.rmtree(pg.data_dir, ignore_errors=True)


@contextmanager
def empty_database(admin_url: str, label: str) -> Iterator[str]:
    """A new empty database on the server, dropped afterwards; yields its name."""
    name = f"fencebridge_bench_{label}_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@contextmanager
def bench_database(admin_url: str, label: str) -> Iterator[str]:
    """A migrated database of its own, dropped afterwards."""
    with empty_database(admin_url, label) as name:
        url = conninfo.make_conninfo(admin_url, dbname=name)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield url


def admin(url: str, *statements: str | tuple[str, dict[str, Any]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for item in statements:
            text, params = item if isinstance(item, tuple) else (item, None)
            conn.execute(text.encode(), params)


def checkpoint(url: str) -> None:
    """Start each round from a fresh checkpoint (the same full-page-write cost); best effort."""
    with psycopg.connect(url, autocommit=True) as conn, suppress(psycopg.Error):
        conn.execute("CHECKPOINT")


def prepare_queue(url: str, run: str, rows: int) -> None:
    """Remove the previous round's rows, queue ``rows`` fresh ones, vacuum and analyze."""
    params = {"run": run, "n": rows, "body": BODY}
    admin(url, RESET, (FILL_QUEUE_PAYLOAD, params), (FILL_QUEUE, params), VACUUM)


def fill_history(url: str, rows: int) -> None:
    params = {"n": rows, "body": BODY}
    admin(url, (FILL_HISTORY_PAYLOAD, params), (FILL_HISTORY, params), VACUUM)


def empty_work(url: str) -> None:
    """An empty work table, so that each round of a broker benchmark starts like the first."""
    admin(url, EMPTY_WORK, "VACUUM ANALYZE work_item")


def work_rows(url: str, *, succeeded: bool = False) -> int:
    """Rows in the work table; with ``succeeded``, only those that succeeded."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(SUCCEEDED_ROWS if succeeded else WORK_ROWS).fetchone()
    return int(row[0]) if row else 0


# -- driving threads -------------------------------------------------------------------------


def drive(executor: ThreadPoolExecutor, arm: Arm, seconds: float) -> Sample:
    """Run each step of the arm in its own thread until the time is up or the queue is dry."""
    barrier = threading.Barrier(len(arm))

    def worker(step: Step) -> tuple[int, float, float, bool]:
        barrier.wait()
        start = time.perf_counter()
        deadline = start + seconds
        done, dry = 0, False
        while time.perf_counter() < deadline:
            moved = step()
            if moved == 0:
                dry = True
                break
            done += moved
        return done, start, time.perf_counter(), dry

    cpu = time.process_time()
    futures = [executor.submit(worker, step) for step in arm]
    results = [f.result() for f in futures]  # re-raises a worker's exception
    cpu = time.process_time() - cpu
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    return Sample(sum(r[0] for r in results), elapsed, cpu, any(r[3] for r in results))


def interleave(arms: Mapping[K, Arm], seconds: float, slices: int) -> dict[K, Sample]:
    """Alternate the arms in ``slices`` slices each (A B, B A, ...); totals per arm."""
    totals = {key: Sample() for key in arms}
    order = list(arms)
    width = max(len(arm) for arm in arms.values())
    with ThreadPoolExecutor(max_workers=width) as executor:
        for k in range(slices):
            for key in order if k % 2 == 0 else reversed(order):
                if not totals[key].drained:
                    totals[key].add(drive(executor, arms[key], seconds / slices))
    return totals


@contextmanager
def library(
    url: str, threads: int, attempt_history: int = ATTEMPT_HISTORY_DEFAULT
) -> Iterator[PostgresStore]:
    """The store as an application opens it, with a pool of one connection per worker."""
    store = PostgresStore.connect(
        url, min_size=threads, max_size=threads, attempt_history=attempt_history
    )
    try:
        store.pool.wait(timeout=30)
        yield store
    finally:
        store.close()


@contextmanager
def raw(url: str, threads: int) -> Iterator[list[Connection]]:
    conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
    try:
        yield conns
    finally:
        for c in conns:
            c.close()


# -- ingest ----------------------------------------------------------------------------------


def deliveries(run: str, count: int) -> Iterator[list[Delivery]]:
    """Batches built ahead of time, so neither arm pays for building them."""
    items = [
        Delivery(
            tenant_id="bench",
            operation_id=f"{run}-{i}",
            subscription="bench",
            job_type="bench.job",
            target_class=TargetClass.C,
            payload=BODY,
            broker_message_id=f"m-{run}-{i}",
            receive_count=1,
        )
        for i in range(count)
    ]
    return iter([items[i : i + INGEST_BATCH] for i in range(0, count, INGEST_BATCH)])


def raw_insert_params(batch: Sequence[Delivery], refs: Sequence[str]) -> dict[str, Any]:
    """What hand-written code passes to ingest_insert.sql: the batch as the store sends it, the
    process's identity key and the clock left to the database, no priority aging, no row
    written claimed."""
    return {
        **insert_params(batch, refs),
        "worker": None,
        "identity_key_id": None,
        "aging": 0.0,
        "now": None,
    }


def library_ingest_step(store: PostgresStore, batches: Iterator[list[Delivery]]) -> Step:
    def step() -> int:
        batch = next(batches, None)
        if batch is None:
            return 0
        store.inbox.ingest(batch)
        return len(batch)

    return step


def raw_ingest_step(conn: Connection, batches: Iterator[list[Delivery]]) -> Step:
    """The statement the store sends for a batch of new operations: ingest_batch.sql, the
    insert and its check (every key decided; no identity keys, so any tombstone refuses), its
    own transaction."""
    insert = sql.statement("ingest_batch")
    no_keys = {"key_id": [], "operation_hash": [], "any_erased": True, "copies": None}

    def step() -> int:
        batch = next(batches, None)
        if batch is None:
            return 0
        token = secrets.token_hex(16)  # as the store draws them: one per batch
        refs = [f"pg:{token}-{i}" for i in range(len(batch))]
        conn.execute(
            insert,
            {**raw_insert_params(batch, refs), **no_keys, "expected": len(batch), "conflict": ""},
        )
        return len(batch)

    return step


def ingest_round(url: str, plan: Plan, threads: int, run: str) -> dict[str, Sample]:
    admin(url, RESET, VACUUM)
    checkpoint(url)
    per = plan.ingest_rows // threads
    with library(url, threads) as store, raw(url, threads) as conns:
        arms = {
            LIBRARY: [
                library_ingest_step(store, deliveries(f"{run}-l{i}", per)) for i in range(threads)
            ],
            RAW: [raw_ingest_step(c, deliveries(f"{run}-r{i}", per)) for i, c in enumerate(conns)],
        }
        return interleave(arms, plan.seconds, plan.slices)


# -- claim + complete ------------------------------------------------------------------------


def claim_params(worker: str, limit: int) -> dict[str, Any]:
    return {
        "worker": worker,
        "limit": limit,
        "lease": LEASE,
        "job_types": None,
        "identity_keys": None,
        "history": ATTEMPT_HISTORY_DEFAULT,
        "slots": None,  # no concurrency limit
        "now": None,
    }


def fenced_out() -> RuntimeError:
    return RuntimeError("a fresh claim was fenced out: the benchmark is broken")


def library_claim_step(store: PostgresStore, worker: str, batch: int) -> Step:
    if batch == 1:

        def single() -> int:
            claims = store.claims.claim(worker, 1, LEASE)
            if not claims:
                return 0
            store.settle.settle(Settlement(claims[0].ticket, State.SUCCEEDED, "ok"))
            return 1

        return single

    def batched() -> int:
        claims = store.claims.claim(worker, batch, LEASE)
        if not claims:
            return 0
        if store.settle.settle_many(
            [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in claims]]
        ):
            raise fenced_out()
        return len(claims)

    return batched


def settle_many_params(rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """Complete claimed rows (tenant_id, operation_id, fence first) as hand-written code would."""
    return {
        "tenant_id": [r[0] for r in rows],
        "operation_id": [r[1] for r in rows],
        "fence": [r[2] for r in rows],
        "state": ["succeeded"] * len(rows),
        "outcome_code": ["ok"] * len(rows),
        "outcome_detail": [None] * len(rows),
        "error_class": [None] * len(rows),
        "finding": [None] * len(rows),
        "history": ATTEMPT_HISTORY_DEFAULT,
        "now": None,
    }


def raw_claim_step(conn: Connection, worker: str, batch: int) -> Step:
    claim = sql.with_limit("claim", batch)  # the text the store sends
    settle = sql.statement("settle")
    settle_many = sql.statement("settle_many")
    if batch == 1:

        def single() -> int:
            rows = conn.execute(claim, claim_params(worker, 1)).fetchall()
            if not rows:
                return 0
            tenant_id, operation_id, fence = rows[0][:3]
            done = conn.execute(
                settle,
                {
                    "tenant_id": tenant_id,
                    "operation_id": operation_id,
                    "fence": fence,
                    "state": "succeeded",
                    "outcome_code": "ok",
                    "outcome_detail": None,
                    "error_class": None,
                    "finding": None,
                    "history": ATTEMPT_HISTORY_DEFAULT,
                    "now": None,
                },
            ).fetchone()
            if done is None:
                raise fenced_out()
            return 1

        return single

    def batched() -> int:
        rows = conn.execute(claim, claim_params(worker, batch)).fetchall()
        if not rows:
            return 0
        moved = conn.execute(settle_many, settle_many_params(rows)).fetchall()
        if len(moved) != len(rows):
            raise fenced_out()
        return len(rows)

    return batched


def claim_round(
    urls: Mapping[str, str], plan: Plan, *, threads: int, batch: int, run: str, rows: int
) -> dict[tuple[str, str], Sample]:
    """One round over each database: both arms share its freshly filled queue (``rows`` each)."""
    for db_url in urls.values():
        prepare_queue(db_url, run, 2 * rows)
    checkpoint(next(iter(urls.values())))
    arms: dict[tuple[str, str], Arm] = {}
    with ExitStack() as stack:
        for db, db_url in urls.items():
            store = stack.enter_context(library(db_url, threads))
            conns = stack.enter_context(raw(db_url, threads))
            workers = [f"{run}-{db}-w{i}" for i in range(threads)]
            arms[(db, LIBRARY)] = [library_claim_step(store, f"{w}l", batch) for w in workers]
            arms[(db, RAW)] = [
                raw_claim_step(c, f"{w}r", batch) for c, w in zip(conns, workers, strict=True)
            ]
        return interleave(arms, plan.seconds, plan.slices)


def attempts_round(
    url: str, plan: Plan, *, threads: int, batch: int, run: str, rows: int
) -> dict[str, Sample]:
    """One round: the library with the attempt history on beside off, on one shared queue."""
    prepare_queue(url, run, 2 * rows)
    checkpoint(url)
    arms: dict[str, Arm] = {}
    with ExitStack() as stack:
        for arm, kept in ((ON, ATTEMPT_HISTORY_DEFAULT), (OFF, 0)):
            store = stack.enter_context(library(url, threads, kept))
            arms[arm] = [
                library_claim_step(store, f"{run}-{arm}-w{i}", batch) for i in range(threads)
            ]
        return interleave(arms, plan.seconds, plan.slices)


# -- EXPLAIN ---------------------------------------------------------------------------------


@dataclass
class Explained:
    """A statement's server-side cost over repeated EXPLAIN (ANALYZE, BUFFERS) runs."""

    ms: list[float] = field(default_factory=list)
    buffers: list[int] = field(default_factory=list)
    plan: str = ""

    def cell(self) -> str:
        return f"{statistics.median(self.ms):.3f} ms, {statistics.median(self.buffers):.0f}"


def explain(conn: Connection, text: str, params: dict[str, Any], into: Explained) -> None:
    """Run the statement under EXPLAIN (ANALYZE, BUFFERS); keep its time and shared buffers."""
    lines = [r[0] for r in conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {text}".encode(), params)]
    top = next((ln.strip() for ln in lines if ln.strip().startswith("Buffers:")), "")
    counts = [int(word.split("=")[1]) for word in top.split() if word.startswith(("hit=", "read="))]
    execution = next(ln for ln in lines if ln.startswith("Execution Time"))
    into.ms.append(float(execution.split()[2]))
    into.buffers.append(sum(counts))
    into.plan = "\n".join(lines)


def statement_costs(
    urls: Mapping[str, str], iterations: int, queued: int
) -> dict[str, dict[str, Explained]]:
    """Claim 10, then complete them, under EXPLAIN (ANALYZE, BUFFERS), alternating databases.

    The statements really run (autocommit), so the queue moves on as it does in production.
    This is their cost inside the server, free of commit latency and client scheduling: what
    history could make grow.
    """
    for db_url in urls.values():
        prepare_queue(db_url, "explain", max(queued, 10 * (iterations + 2)))
    found = {db: {"claim": Explained(), "complete_many": Explained()} for db in urls}
    with ExitStack() as stack:
        conns = {
            db: stack.enter_context(psycopg.connect(u, autocommit=True)) for db, u in urls.items()
        }
        for i in range(iterations + 2):  # the first two warm the caches and are not kept
            for db in list(urls) if i % 2 == 0 else reversed(list(urls)):
                conn = conns[db]
                into = found[db] if i > 1 else {k: Explained() for k in found[db]}
                worker = f"explain-{i}"
                explain(conn, sql.statement("claim"), claim_params(worker, 10), into["claim"])
                claimed = conn.execute(CLAIMED_BY, {"worker": worker}).fetchall()
                explain(
                    conn,
                    sql.statement("settle_many"),
                    settle_many_params(claimed),
                    into["complete_many"],
                )
    return found


# -- machine facts ---------------------------------------------------------------------------


def machine_facts(admin_url: str, argv: Sequence[str]) -> list[tuple[str, str]]:
    cpu = platform.processor() or "unknown"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = conn.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY (%s) ORDER BY name",
            [list(PG_SETTINGS)],
        ).fetchall()
    libpq = psycopg.pq.version()
    shown = ", ".join(f"{n}={_with_unit(s, u)}" for n, s, u in settings)
    return [
        ("CPU", f"{cpu}, {os.cpu_count()} cores ({platform.machine()})"),
        ("RAM", ram),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("PostgreSQL", f"{version[0] if version else '?'}, on the same host"),
        ("PostgreSQL settings", shown),
        ("schema", f"fencebridge migrations 1..{sql.migrations()[-1].version}"),
        ("Python", platform.python_version()),
        (
            "psycopg",
            f"psycopg {metadata.version('psycopg')} ({psycopg.pq.__impl__}, libpq "
            f"{libpq // 10000}.{libpq % 10000}), psycopg-pool {metadata.version('psycopg-pool')}",
        ),
        ("command", " ".join(shlex.quote(a) for a in argv)),
    ]


def binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        candidate = Path(bindir) / name
        if candidate.exists():
            return str(candidate)
    raise RuntimeError(f"{name} not found: install PostgreSQL's client tools (it ships with them)")


def fsync_rate(admin_url: str) -> str:
    """fdatasync ops/s of one 8 kB write, by ``pg_test_fsync``, and on which disk.

    On the disk of the server's data directory when the server is local and the directory can
    be written, else of a temporary directory, which the text then says: every absolute figure
    of a benchmark depends on it, so every report states it."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT setting FROM pg_settings WHERE name = 'data_directory'"
        ).fetchone()
    data_dir = Path(row[0]) if row and row[0] else None
    where, probe_dir = "a temporary directory (the data directory is not local)", None
    if data_dir is not None and data_dir.is_dir():
        try:
            probe = data_dir / "fencebridge_fsync_probe.tmp"
            probe.touch()
            probe.unlink()
            probe_dir, where = data_dir, "the data directory's disk"
        except OSError:
            pass
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(probe_dir or tmp) / "fencebridge_fsync_probe.tmp"
        try:
            done = subprocess.run(
                [binary("pg_test_fsync"), "-s", "1", "-f", str(target)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            target.unlink(missing_ok=True)
    match = re.search(r"^\s*fdatasync\s+([\d.]+) ops/sec", done.stdout, re.MULTILINE)
    if not match:
        return f"unknown (pg_test_fsync exited {done.returncode})"
    return f"fdatasync {float(match.group(1)):,.0f} ops/s (pg_test_fsync, one 8 kB write, {where})"


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_times() -> tuple[int, int, int] | None:
    """Busy, stolen and total CPU time of the machine so far (``/proc/stat``, in ticks)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(fields[:8])  # guest time is counted in user time already
    idle = fields[3] + fields[4]
    stolen = fields[7] if len(fields) > 7 else 0
    return total - idle - stolen, stolen, total


def cpu_since(start: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """Busy, stolen and total CPU ticks of the machine since ``start``; None if unreadable."""
    end = cpu_times()
    if start is None or end is None or end[2] <= start[2]:
        return None
    busy, stolen, total = (b - a for a, b in zip(start, end, strict=True))
    return busy, stolen, total


def cpu_share(start: tuple[int, int, int] | None) -> str:
    """The machine's CPU time since ``start``: busy, and stolen by the hypervisor (time a
    virtual machine's processors wanted to run and another guest ran instead)."""
    spent = cpu_since(start)
    if spent is None:
        return "unknown"
    busy, stolen, total = spent
    return f"{busy / total:.0%} busy, {stolen / total:.0%} stolen"


def _with_unit(setting: str, unit: str | None) -> str:
    """pg_settings counts memory in pages; say it in MB like SHOW does."""
    if unit == "8kB":
        return f"{int(setting) * 8 // 1024}MB"
    if unit == "kB":
        return f"{int(setting) // 1024}MB"
    return f"{setting}{unit or ''}"


@contextmanager
def report_facts(
    admin_url: str, argv: Sequence[str], *extra: tuple[str, str]
) -> Iterator[list[tuple[str, str]]]:
    """A report's header facts: the machine's (``extra`` before the command), then the load
    average at the start and end of the ``with`` body, the CPU time it saw (busy, and stolen
    by the hypervisor: on a shared host, what other guests took), and its duration."""
    facts = machine_facts(admin_url, argv)
    facts[-1:-1] = [("fsync", fsync_rate(admin_url)), *extra]
    load = load_average()
    cpu = cpu_times()
    started = time.perf_counter()
    yield facts
    took = time.perf_counter() - started
    facts.append(("load average 1/5/15 min", f"{load} at start, {load_average()} at end"))
    facts.append(("CPU time during the run", cpu_share(cpu)))
    facts.append(("duration", f"{took:.0f}s"))


def facts_table(facts: Sequence[tuple[str, str]]) -> list[str]:
    return ["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in facts)]


# -- the report ------------------------------------------------------------------------------


def _mode(batch: int) -> str:
    return "single" if batch == 1 else f"batch {batch}"


def spread(values: Sequence[float]) -> str:
    """The median, with min..max."""
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}..{max(values):,.0f})"


def cell(values: Sequence[float], digits: int = 0) -> str:
    """The median, with min..max when there is more than one value."""
    text = f"{statistics.median(values):,.{digits}f}"
    if len(values) > 1:
        text += f" ({min(values):,.{digits}f}..{max(values):,.{digits}f})"
    return text


def planned(plan: PlanT, args: argparse.Namespace, names: Sequence[str]) -> PlanT:
    """``plan`` with each of the options ``names`` that the command line gave (a 0 included)."""
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return replace(plan, **given)


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    ingest: dict[int, dict[str, Series]] = field(default_factory=dict)
    claim: dict[tuple[int, int], dict[str, Series]] = field(default_factory=dict)
    history: dict[int, dict[tuple[str, str], Series]] = field(default_factory=dict)
    costs: dict[str, dict[str, Explained]] = field(default_factory=dict)
    attempts: dict[int, dict[str, Series]] = field(default_factory=dict)

    def markdown(self) -> str:
        plan = self.plan
        out = facts_table(self.facts)
        out += [
            "",
            f"Rows/s: median of {plan.runs} rounds ({plan.history_runs} for the history"
            " comparison), with min..max; library/raw and slowdown: median of the per-round"
            " ratios; CPU: client CPU microseconds per row, library / raw.",
        ]
        if self.ingest:
            out += ["", "Ingest, batches of 10 new deliveries, one transaction each:", ""]
            out += ["| threads | library rows/s | raw rows/s | library/raw | CPU us/row |"]
            out += ["| ---: | ---: | ---: | ---: | ---: |"]
            for threads, v in self.ingest.items():
                out.append(f"| {threads} | {_pair(v[LIBRARY], v[RAW])} |")
        if self.claim:
            out += ["", "Claim + complete:", ""]
            out += ["| mode | workers | library rows/s | raw rows/s | library/raw | CPU us/row |"]
            out += ["| --- | ---: | ---: | ---: | ---: | ---: |"]
            for (batch, threads), v in self.claim.items():
                out.append(f"| {_mode(batch)} | {threads} | {_pair(v[LIBRARY], v[RAW])} |")
        hist = f"{plan.history_rows:,}"
        if self.history:
            out += ["", f"Claim + complete with {hist} terminal rows present vs none:", ""]
            out += ["| mode | workers | arm | none rows/s | history rows/s | slowdown |"]
            out += ["| --- | ---: | --- | ---: | ---: | ---: |"]
            for batch, h in self.history.items():
                for arm in (LIBRARY, RAW):
                    none, full = h[(NONE, arm)], h[(HISTORY, arm)]
                    out.append(
                        f"| {_mode(batch)} | {plan.history_threads} | {arm} | {none.rate_cell()} "
                        f"| {full.rate_cell()} | {_slowdown(full, none):+.1f}% |"
                    )
        if self.attempts:
            kept = ATTEMPT_HISTORY_DEFAULT
            out += ["", f"Claim + complete with the attempt history on ({kept} kept) vs off:", ""]
            out += ["| mode | workers | off rows/s | on rows/s | slowdown | CPU us/row off / on |"]
            out += ["| --- | ---: | ---: | ---: | ---: | ---: |"]
            for batch, v in self.attempts.items():
                out.append(
                    f"| {_mode(batch)} | {plan.history_threads} | {v[OFF].rate_cell()} "
                    f"| {v[ON].rate_cell()} | {_slowdown(v[ON], v[OFF]):+.1f}% "
                    f"| {v[OFF].cpu_cell()} / {v[ON].cpu_cell()} |"
                )
        out += ["", *self.goals()]
        if self.costs:
            n = len(self.costs[NONE]["claim"].ms)
            out += [
                "",
                f"Inside the server, 10 rows (EXPLAIN (ANALYZE, BUFFERS); median of"
                f" {n}: execution time, shared buffers hit + read):",
                "",
                f"| statement | none | {hist} terminal rows |",
                "| --- | ---: | ---: |",
            ]
            for name in ("claim", "complete_many"):
                costs = (self.costs[NONE][name], self.costs[HISTORY][name])
                out.append(f"| {name} | {costs[0].cell()} | {costs[1].cell()} |")
        everything = [
            *(s for v in self.ingest.values() for s in v.values()),
            *(s for v in self.claim.values() for s in v.values()),
            *(s for h in self.history.values() for s in h.values()),
            *(s for v in self.attempts.values() for s in v.values()),
        ]
        if any(x.drained for series in everything for x in series.samples):
            out += ["", "`*` the queue ran dry in at least one round."]
        return "\n".join(out) + "\n"

    def goals(self) -> list[str]:
        out = ["| goal | measured | met |", "| --- | --- | --- |"]
        top = max(self.plan.threads)
        for batch in (1, CLAIM_BATCH):
            v = self.claim.get((batch, top))
            if v:
                r = ratio(v[LIBRARY], v[RAW])
                out.append(
                    f"| claim + complete ({_mode(batch)}), {top} workers: library >= 0.8x raw "
                    f"| {r:.2f}x | {'yes' if r >= 0.8 else 'NO'} |"
                )
        for batch, h in self.history.items():
            slow = _slowdown(h[(HISTORY, LIBRARY)], h[(NONE, LIBRARY)])
            out.append(
                f"| claim + complete ({_mode(batch)}) with {self.plan.history_rows:,} terminal "
                f"rows: <= 10% slower | {slow:+.1f}% | {'yes' if slow <= 10 else 'NO'} |"
            )
        for batch, v in self.attempts.items():
            slow = _slowdown(v[ON], v[OFF])
            out.append(
                f"| claim + complete ({_mode(batch)}) with the attempt history on: <= 10% slower"
                f" | {slow:+.1f}% | {'yes' if slow <= 10 else 'NO'} |"
            )
        return out if len(out) > 2 else []


def _pair(lib: Series, rw: Series) -> str:
    return (
        f"{lib.rate_cell()} | {rw.rate_cell()} | {ratio(lib, rw):.2f} "
        f"| {lib.cpu_cell()} / {rw.cpu_cell()}"
    )


def _slowdown(full: Series, none: Series) -> float:
    return (1 - ratio(full, none)) * 100


# -- main ------------------------------------------------------------------------------------


class Runner:
    """Runs the sections of a plan and fills the report."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.plan = report.plan
        self._rounds = 0

    def _label(self, prefix: str) -> str:
        self._rounds += 1
        return f"{prefix}{self._rounds}"

    def ingest(self, url: str) -> None:
        for threads in self.plan.ingest_threads:
            series = {LIBRARY: Series(), RAW: Series()}
            for r in range(self.plan.runs):
                got = ingest_round(url, self.plan, threads, self._label("i"))
                for arm, s in got.items():
                    series[arm].samples.append(s)
                log(f"ingest {threads}t round {r + 1}: {_line(got)}")
            self.report.ingest[threads] = series

    def _claim_round(
        self, urls: Mapping[str, str], threads: int, batch: int, before: Sequence[Sample]
    ) -> dict[tuple[str, str], Sample]:
        rows = self.plan.queue_rows(batch)
        if before:
            fastest = max(s.rate * self.plan.seconds for s in before)
            grown = 2 * rows if any(s.drained for s in before) else 0
            rows = max(rows, int(3 * fastest), grown)
        return claim_round(
            urls, self.plan, threads=threads, batch=batch, run=self._label("c"), rows=rows
        )

    def claim(self, url: str) -> None:
        for batch in (1, CLAIM_BATCH):
            for threads in self.plan.threads:
                series = {LIBRARY: Series(), RAW: Series()}
                for r in range(self.plan.runs):
                    before = [x for v in series.values() for x in v.samples]
                    got = self._claim_round({"main": url}, threads, batch, before)
                    for (_, arm), s in got.items():
                        series[arm].samples.append(s)
                    log(f"claim {_mode(batch)} {threads}t round {r + 1}: {_line(got)}")
                self.report.claim[(batch, threads)] = series

    def history(self, url: str, hist_url: str) -> None:
        started = time.perf_counter()
        fill_history(hist_url, self.plan.history_rows)
        took = time.perf_counter() - started
        log(f"history: {self.plan.history_rows:,} terminal rows written in {took:.0f}s")
        urls = {NONE: url, HISTORY: hist_url}
        threads = self.plan.history_threads
        for batch in (1, CLAIM_BATCH):
            series: dict[tuple[str, str], Series] = {}
            for r in range(self.plan.history_runs):
                before = [x for v in series.values() for x in v.samples]
                got = self._claim_round(urls, threads, batch, before)
                for key, s in got.items():
                    series.setdefault(key, Series()).samples.append(s)
                log(f"history {_mode(batch)} {threads}t round {r + 1}: {_line(got)}")
            self.report.history[batch] = series
        self.report.costs = statement_costs(urls, self.plan.explain_runs, self.plan.queue_batch)
        for db, costs in self.report.costs.items():
            for name, cost in costs.items():
                log(f"EXPLAIN (ANALYZE, BUFFERS) {name}, {db}: {cost.cell()}\n{cost.plan}")

    def attempts(self, url: str) -> None:
        threads = self.plan.history_threads
        for batch in (1, CLAIM_BATCH):
            series = {ON: Series(), OFF: Series()}
            for r in range(self.plan.history_runs):
                before = [x for v in series.values() for x in v.samples]
                rows = self.plan.queue_rows(batch)
                if before:
                    rows = max(rows, int(3 * max(s.rate * self.plan.seconds for s in before)))
                got = attempts_round(
                    url, self.plan, threads=threads, batch=batch, run=self._label("a"), rows=rows
                )
                for arm, s in got.items():
                    series[arm].samples.append(s)
                log(f"attempts {_mode(batch)} {threads}t round {r + 1}: {_line(got)}")
            self.report.attempts[batch] = series


def _line(samples: Mapping[K, Sample]) -> str:
    def name(key: K) -> str:
        return " ".join(key) if isinstance(key, tuple) else str(key)

    return ", ".join(
        f"{name(k)} {s.rate:,.0f}/s{' (dry)' if s.drained else ''}" for k, s in samples.items()
    )


@contextmanager
def timed(section: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    log(f"-- {section} took {time.perf_counter() - started:.0f}s")


def run(database_url: str | None, plan: Plan, sections: Sequence[str], argv: list[str]) -> Report:
    report = Report(plan)
    runner = Runner(report)
    with server(database_url) as admin_url, report_facts(admin_url, argv) as facts:
        report.facts = facts
        if "ingest" in sections or "claim" in sections:
            with bench_database(admin_url, "main") as url:
                if "ingest" in sections:
                    with timed("ingest"):
                        runner.ingest(url)
                if "claim" in sections:
                    with timed("claim"):
                        runner.claim(url)
        if "history" in sections:
            # Two fresh databases, so neither carries free space left by the sections above.
            with (
                timed("history"),
                bench_database(admin_url, NONE) as none_url,
                bench_database(admin_url, HISTORY) as hist_url,
            ):
                runner.operator.history(none_url, hist_url)
        if "attempts" in sections:
            with timed("attempts"), bench_database(admin_url, "attempts") as url:
                runner.attempts(url)
    return report


def arguments(module: str, description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: the server, and a smoke run."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument(
        "--database-url",
        help=f"server to create the benchmark databases on (default: ${DATABASE_URL_ENV}, "
        "else an embedded PostgreSQL)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: short and small")
    return parser


def command_line(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments, and the command as the report quotes it."""
    args = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args(args), [*parser.prog.split(), *args]


def options() -> argparse.ArgumentParser:
    parser = arguments(
        "bench.store", "Work store throughput: the library beside the same SQL run raw."
    )
    parser.add_argument("--runs", type=int, help="rounds per measurement")
    parser.add_argument("--seconds", type=float, help="seconds per arm and round")
    parser.add_argument("--history-rows", type=int, help="terminal rows in the history database")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeatable; default: all)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, command = command_line(options(), argv)
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.runs:
        overrides["runs"] = overrides["history_runs"] = args.runs
    if args.seconds:
        overrides["seconds"] = args.seconds
    if args.history_rows:
        overrides["history_rows"] = args.history_rows
    plan = replace(plan, **overrides)
    sections = args.only or SECTIONS
    print(run(args.database_url, plan, sections, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())


@contextmanager
def autovacuum_on(admin_url: str, enable: bool) -> Iterator[None]:
    """Autovacuum on for the run, as production runs: a server that has it off is refused, or,
    with ``enable``, has it turned on (``ALTER SYSTEM``) and reset afterwards."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        if row and row[0] == "on":
            yield
            return
        if not enable:
            raise SystemExit(
                "autovacuum is off on this server, and this benchmark needs it: pass "
                "--enable-autovacuum to turn it on for the run (ALTER SYSTEM, reset afterwards) "
                "or use a server that has it on"
            )
        conn.execute("ALTER SYSTEM SET autovacuum = on")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET autovacuum")
            conn.execute("SELECT pg_reload_conf()")
