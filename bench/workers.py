"""The worker tier beside PgQueuer and Procrastinate: drain a queue of no-op jobs.

Each system drains the same workload on the same PostgreSQL server: 20,000 jobs queued
beforehand with the system's own batch API (batches of 1,000, about 100 bytes of JSON each),
then drained by a no-op handler at 1, 4 and 16 concurrent workers. Every drain runs in a fresh
Python process on a fresh database of its own, created here and dropped afterwards; the
process installs the system's schema, queues the jobs, runs ``VACUUM ANALYZE`` and
``CHECKPOINT``, drains, and reports one line of JSON (see :mod:`bench.peers`).

* ``fencebridge``: :class:`~bridge.worker.WorkerPool` with ``threads`` = the concurrency and
  its default claim batch, a class B handler that returns at once (the cheapest executor), the
  store's pool holding one connection per thread plus two; jobs queued with
  :meth:`~bridge.store.PostgresStore.ingest`. Rows are kept as ``succeeded``.
* ``pgqueuer`` and ``procrastinate``: see :mod:`bench.peers.pgqueuer_drain` and
  :mod:`bench.peers.procrastinate_drain` for their configuration and completion semantics.

Rate and latency are read back from each system's own records by the database clock, the same
way for all three: the rate is the job count over the time from the first pick (claim) to the
last settlement, and the latency of a job is its settlement minus its pick. For fencebridge
those are ``work_item.claimed_at`` and ``settled_at``.

Rounds: one warm-up round (every system at every concurrency, on fewer jobs, not reported),
then ``--runs`` measured rounds; within a round the systems take turns at each concurrency, in
an order that rotates from round to round, so all of them see the same background load. The
report gives medians with min..max. The peers must be importable (``make bench`` installs them
into ``.venv-bench``; they are not dependencies of the project)::

    python -m bench.workers                       # full run: 3 rounds of 20,000 jobs
    python -m bench.workers --quick               # smoke run: 1 round of 2,000 jobs
    python -m bench.workers --concurrency 16 --runs 5 --database-url postgresql://...

The server is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded one. It
prints a markdown section for docs/benchmarks.md on stdout and its progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import conninfo

from bench.peers import ENQUEUE_BATCH, PAYLOAD, Drain, cpu, emit, settle_database, summarize
from bench.store import (
    arguments,
    command_line,
    empty_database,
    facts_table,
    log,
    report_facts,
    server,
)
from bridge.handlers import ConditionalWriteHandler, Context
from bridge.identity import IdentityHasher
from bridge.migrate import migrate
from bridge.registry import Registry
from bridge.store import PostgresStore
from bridge.types import Claim, Delivery, State, TargetClass
from bridge.worker import CLAIM_BATCH_DEFAULT, WorkerPool

FENCEBRIDGE, PGQUEUER, PROCRASTINATE = "fencebridge", "pgqueuer", "procrastinate"
SYSTEMS = (FENCEBRIDGE, PGQUEUER, PROCRASTINATE)
PEERS = (PGQUEUER, PROCRASTINATE)
MODULES = {
    FENCEBRIDGE: "bench.workers",
    PGQUEUER: "bench.peers.pgqueuer_drain",
    PROCRASTINATE: "bench.peers.procrastinate_drain",
}
#: the distributions whose versions the report names
VERSIONS = ("pgqueuer", "procrastinate", "asyncpg", "psycopg", "psycopg-pool")

JOB_TYPE = "bench.noop"
SUBSCRIPTION = "bench"
#: one drain may not take longer than this (a hung system must not hang the benchmark)
DRAIN_TIMEOUT = 1800.0

FENCEBRIDGE_PAIRS = """
SELECT claimed_at AS picked, settled_at AS settled FROM work_item WHERE state = 'succeeded'
"""


@dataclass(frozen=True)
class Plan:
    jobs: int
    warmup_jobs: int
    runs: int
    concurrency: tuple[int, ...]
    systems: tuple[str, ...]


FULL = Plan(jobs=20_000, warmup_jobs=2_000, runs=3, concurrency=(1, 4, 16), systems=SYSTEMS)
QUICK = Plan(jobs=2_000, warmup_jobs=0, runs=1, concurrency=(1, 4, 16), systems=SYSTEMS)


# -- the fencebridge drain (runs in its own process, like the peers) ----------------------------


class Noop(ConditionalWriteHandler):
    """Writes nothing: the run is the claim and the fenced settlement alone."""

    def handle(self, ctx: Context) -> None:
        return None


class Settled:
    """The events receiver that tells the drain when every job has settled."""

    def __init__(self, expected: int) -> None:
        self._lock = threading.Lock()
        self._left = expected
        self.done = threading.Event()
        self.problems = 0

    def _count(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.done.set()

    def claimed(self, claim: Claim) -> None:
        pass

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self._count()

    def lease_lost(self, claim: Claim, action: str) -> None:
        self.problems += 1

    def fenced_out(self, claim: Claim) -> None:
        self.problems += 1

    def reconciled(self, claim: Claim, finding: str) -> None:
        pass

    def settle_unknown(self, claim: Claim, action: str) -> None:
        self.problems += 1


def fencebridge_prepare(store: PostgresStore, jobs: int) -> None:
    body = json.dumps(PAYLOAD).encode()
    for start in range(0, jobs, ENQUEUE_BATCH):
        store.ingest(
            [
                Delivery(
                    tenant_id="bench",
                    operation_id=f"op-{i}",
                    subscription=SUBSCRIPTION,
                    job_type=JOB_TYPE,
                    target_class=TargetClass.B,
                    payload=body,
                )
                for i in range(start, min(start + ENQUEUE_BATCH, jobs))
            ]
        )


def fencebridge_drain(url: str, jobs: int, concurrency: int) -> Drain:
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    connections = concurrency + 2  # the workers, the claimer and the heartbeater
    store = PostgresStore.connect(url, min_size=connections, max_size=connections)
    try:
        fencebridge_prepare(store, jobs)
        settle_database(url)
        store.pool.wait()
        registry = Registry()
        registry.register(JOB_TYPE, Noop())
        settled = Settled(jobs)
        pool = WorkerPool(
            store,
            registry,
            IdentityHasher.ephemeral(),
            worker_id="bench",
            threads=concurrency,
            claim_batch=CLAIM_BATCH_DEFAULT,
            events=settled,
        )
        started, cpu_started = time.perf_counter(), cpu()
        pool.start()
        settled.done.wait(DRAIN_TIMEOUT)
        pool.stop()
        wall, used = time.perf_counter() - started, cpu() - cpu_started
        if settled.problems:
            log(f"fencebridge: {settled.problems} run(s) did not settle")
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        return summarize(
            conn,
            FENCEBRIDGE_PAIRS,
            system=FENCEBRIDGE,
            concurrency=concurrency,
            jobs=jobs,
            wall=wall,
            cpu=used,
        )


# -- orchestration -----------------------------------------------------------------------------


def database_url(admin_url: str, dbname: str) -> str:
    """A ``postgresql://`` URL for another database on the same server (asyncpg takes no
    key=value strings)."""
    params = conninfo.conninfo_to_dict(admin_url)
    user = quote(str(params.get("user", "postgres")), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password else user
    host = str(params.get("host", "localhost"))
    port = params.get("port", 5432)
    if host.startswith("/"):  # a socket directory (an embedded server)
        return f"postgresql://{auth}@/{quote(dbname, safe='')}?host={quote(host)}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{quote(dbname, safe='')}"


def drain(admin_url: str, system: str, jobs: int, concurrency: int) -> Drain:
    """One drain of one system in a process of its own, on a database of its own."""
    with empty_database(admin_url, system) as name:
        url = database_url(admin_url, name)
        command = [
            sys.executable,
            "-m",
            MODULES[system],
            "--database-url",
            url,
            "--jobs",
            str(jobs),
            "--concurrency",
            str(concurrency),
        ]
        if system == FENCEBRIDGE:
            command.append("--drain")
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=DRAIN_TIMEOUT, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"{system} drain failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = Drain(**json.loads(done.stdout.strip().splitlines()[-1]))
    if result.settled != jobs:
        raise RuntimeError(f"{system} settled {result.settled} of {jobs} jobs")
    return result


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    #: (system, concurrency) -> one drain per measured round
    drains: dict[tuple[str, int], list[Drain]] = field(default_factory=dict)

    def markdown(self) -> str:
        systems = self.plan.systems
        lines = [
            f"{self.plan.runs} measured round(s) of {self.plan.jobs:,} jobs per system and "
            "concurrency (after a warm-up round"
            + (f" of {self.plan.warmup_jobs:,} jobs" if self.plan.warmup_jobs else ": none")
            + "). Medians with min..max; ops/s and latencies by the database clock, "
            "first pick to last settlement; CPU: the draining process, milliseconds per job.",
            "",
            *facts_table(self.facts),
            "",
            "| workers | system | ops/s | p50 ms | p99 ms | CPU ms/job |",
            "| ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for c in self.plan.concurrency:
            for system in systems:
                runs = self.drains.get((system, c), [])
                if not runs:
                    continue
                lines.append(
                    f"| {c} | {system} | {_cell([d.rate for d in runs], 0)} | "
                    f"{_cell([d.p50_ms for d in runs], 1)} | {_cell([d.p99_ms for d in runs], 1)} "
                    f"| {statistics.median(d.cpu_seconds * 1000 / d.jobs for d in runs):.2f} |"
                )
        goals = self.goals()
        if goals:
            lines += ["", *goals]
        return "\n".join(lines) + "\n"

    def goals(self) -> list[str]:
        out = []
        for c in self.plan.concurrency:
            ours = self.drains.get((FENCEBRIDGE, c))
            peers = {p: self.drains[(p, c)] for p in PEERS if (p, c) in self.drains}
            if not ours or not peers:
                continue
            best = max(peers, key=lambda p: statistics.median(d.rate for d in peers[p]))
            mine = statistics.median(d.rate for d in ours)
            theirs = statistics.median(d.rate for d in peers[best])
            out.append(
                f"- {c} worker(s): fencebridge {mine:,.0f} ops/s vs the faster peer ({best}) "
                f"{theirs:,.0f} ops/s: {mine / theirs:.2f}x."
            )
        return out


def _cell(values: list[float], digits: int) -> str:
    text = f"{statistics.median(values):,.{digits}f}"
    if len(values) > 1:
        text += f" ({min(values):,.{digits}f}..{max(values):,.{digits}f})"
    return text


def versions() -> str:
    found = []
    for name in VERSIONS:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def rotate(items: Sequence[str], k: int) -> list[str]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def run(database_url: str | None, plan: Plan, argv: list[str]) -> Report:
    report = Report(plan)
    with (
        server(database_url) as admin_url,
        report_facts(admin_url, argv, ("peers", versions())) as facts,
    ):
        report.facts = facts
        if plan.warmup_jobs:
            for c in plan.concurrency:
                for system in plan.systems:
                    log(f"warm-up: {system} at {c}")
                    drain(admin_url, system, plan.warmup_jobs, c)
        for k in range(plan.runs):
            for c in plan.concurrency:
                for system in rotate(plan.systems, k + c):
                    result = drain(admin_url, system, plan.jobs, c)
                    log(
                        f"round {k + 1}: {system} at {c}: {result.rate:,.0f} ops/s, "
                        f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms "
                        f"(wall {result.wall_seconds:.1f}s)"
                    )
                    report.drains.setdefault((system, c), []).append(result)
    return report


def options() -> argparse.ArgumentParser:
    parser = arguments(
        "bench.workers", "The worker tier beside PgQueuer and Procrastinate, no-op jobs."
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain")
    parser.add_argument("--runs", type=int, help="measured rounds")
    parser.add_argument("--concurrency", type=int, action="append", help="workers (repeatable)")
    parser.add_argument("--system", choices=SYSTEMS, action="append", help="(repeatable)")
    parser.add_argument(
        "--drain", action="store_true", help="internal: one fencebridge drain, JSON on stdout"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, command = command_line(options(), argv)
    if args.drain:
        emit(fencebridge_drain(args.database_url, args.jobs, args.concurrency[0]))
        return 0
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.jobs:
        overrides["jobs"] = args.jobs
    if args.runs:
        overrides["runs"] = args.runs
    if args.concurrency:
        overrides["concurrency"] = tuple(args.concurrency)
    if args.system:
        overrides["systems"] = tuple(args.system)
    plan = replace(plan, **overrides)
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
