"""The worker tier beside PgQueuer, Procrastinate, Awa and DBOS, each in its best configuration.

Each system drains the same workload on the same PostgreSQL server: ``--jobs`` no-op jobs
(10,000) queued beforehand with the system's own batch API (batches of 1,000, about 100 bytes of
JSON each). Every drain runs in a fresh Python process on a fresh database of its own, created
here and dropped afterwards; the process installs the system's schema, queues the jobs, runs
``VACUUM ANALYZE`` and ``CHECKPOINT``, drains, runs ``ANALYZE`` and reads back, and reports
one line of JSON (see :mod:`bench.peers`).

Every system runs in every configuration of its own knobs listed in :data:`SWEEP` (a peer is
never held to one setting). Jobs in flight are measured, not assumed: every drain reports the
most jobs picked and not yet settled at one moment, and their mean, from the same records as
its rate (:data:`bench.peers.PEAK_IN_FLIGHT`). A knob's nominal figure can mislead: PgQueuer
without a limit dequeues its next batch as soon as it has handed the last one to tasks, so
2 consumers x batch 8 had 32 jobs in flight at its peak, not 16. The report gives each
configuration's rate with its measured peak and mean, the best of each system whose peak
stayed within 16 in every round beside fencebridge's best within 16, and the best of each
overall, whatever its jobs in flight.

* ``fencebridge``: :class:`~bridge.runtime.worker.WorkerPool` with a class B handler that returns at
  once (the cheapest executor), swept over claimers and over processes (N processes of 16 / N
  threads each, as N replicas would run), with tenant fairness on (the default) and once off;
  the store is opened as ``fencebridge run`` opens it, its pool holding a connection per
  thread, per claimer and one for the heartbeater. Rows are kept as ``succeeded``.
* ``pgqueuer``: consumers x batch, with no limit, with the entrypoint's ``concurrency_limit``
  and with ``max_concurrent_tasks`` (:mod:`bench.peers.pgqueuer_drain`).
* ``procrastinate``: the worker's ``concurrency`` (:mod:`bench.peers.procrastinate_drain`).
* ``awa``: Awa's Python workers on its Rust engine, its queue's ``max_workers`` x
  ``claimers`` (:mod:`bench.peers.awa_drain`).
* ``dbos``: DBOS Transact, a queue of no-op workflows whose ids are the jobs' keys, every tenth
  queued twice; the queue's ``worker_concurrency`` at a 10 ms polling interval
  (:mod:`bench.peers.dbos_drain`).
* ``loop``: the same statements driven by a bare Python loop of worker threads, none of the
  pool's machinery (:mod:`bench.loop`), with the settlements beside the claim or within its
  transaction: what a Python process gets out of them here, so that the report shows how much
  of the gap is the pool's.
* ``ceiling``: ``pgbench`` running fencebridge's own ``claim.sql`` (10 rows) and
  ``settle_many.sql`` at 16 clients (:mod:`bench.ceiling`): what its statements can do here.

Rate and latency are read back from each system's own records by the database clock, the same
way for all: the rate is the job count over the time from the first pick (claim) to the last
settlement, and the latency of a job is its settlement minus its pick. Awa's and DBOS's
handlers also count each job's runs: the report gives, for those two, the jobs that ran
exactly once and the runs beyond the first (correctness: each job once).

Rounds: one warm-up round on fewer jobs (not reported), then ``--runs`` measured rounds; within
a round every configuration drains once, in an order that rotates from round to round, so all
see the same background load. Ratios are taken from the medians of this one run. The peers must
be importable (``make bench`` installs them into ``.venv-bench``)::

    python -m bench.workers                       # full run: 3 rounds of 10,000 jobs
    python -m bench.workers --quick               # smoke run: 1 round of 5,000 jobs
    python -m bench.workers --system fencebridge --runs 5 --database-url postgresql://...

The server is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded one. It
prints a markdown section for docs/benchmarks.md on stdout and its progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib import metadata
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import conninfo

from bench.ceiling import claim_settle_ceiling
from bench.loop import BESIDE, SHAPES, WITHIN, PinnedStore
from bench.loop import drain as loop_drain
from bench.peers import ENQUEUE_BATCH, PAYLOAD, Drain, cpu, emit, settle_database, summarize
from bench.store import (
    arguments,
    autovacuum_on,
    bench_database,
    command_line,
    empty_database,
    facts_table,
    log,
    report_facts,
    server,
)
from bridge.database import open_pool
from bridge.events import EventCounter
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context
from bridge.identity import IdentityHasher
from bridge.runtime.collector import settle_in
from bridge.runtime.worker import CLAIMERS_DEFAULT, WorkerPool
from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.store.migrate import migrate
from bridge.types import Claim, Delivery, State, TargetClass

FENCEBRIDGE, PGQUEUER, PROCRASTINATE, AWA, DBOS, CEILING, LOOP = (
    "fencebridge",
    "pgqueuer",
    "procrastinate",
    "awa",
    "dbos",
    "ceiling",
    "loop",
)
SYSTEMS = (FENCEBRIDGE, PGQUEUER, PROCRASTINATE, AWA, DBOS, CEILING, LOOP)
PEERS = (PGQUEUER, PROCRASTINATE, AWA, DBOS)
MODULES = {
    FENCEBRIDGE: "bench.workers",
    LOOP: "bench.workers",
    PGQUEUER: "bench.peers.pgqueuer_drain",
    PROCRASTINATE: "bench.peers.procrastinate_drain",
    AWA: "bench.peers.awa_drain",
    DBOS: "bench.peers.dbos_drain",
}
#: the distributions whose versions the report names
VERSIONS = (
    "pgqueuer",
    "procrastinate",
    "awa-pg",
    "dbos",
    "asyncpg",
    "psycopg",
    "psycopg-pool",
    "sqlalchemy",
)

JOB_TYPE = "bench.noop"
SUBSCRIPTION = "bench"
#: the jobs in flight the systems are compared at
IN_FLIGHT = 16
#: one drain may not take longer than this (a hung system must not hang the benchmark)
DRAIN_TIMEOUT = 1800.0

FENCEBRIDGE_PAIRS = """
SELECT claimed_at AS picked, settled_at AS settled FROM work_item WHERE state = 'succeeded'
"""


@dataclass(frozen=True)
class Config:
    """One configuration of one system: its knobs as drain arguments, and the bound its knobs
    put on the jobs in flight (None: no bound; the drain measures what it had)."""

    system: str
    label: str
    in_flight: int | None
    args: tuple[str, ...] = ()
    #: fencebridge only: the CPU-bound handler instead of the no-op (not compared with peers)
    spin: bool = False


def fencebridge(
    threads: int,
    *,
    claimers: int = CLAIMERS_DEFAULT,
    processes: int = 1,
    spin: bool = False,
    fair: bool = True,
    batch: int | None = None,
) -> Config:
    label = f"{threads} threads, {claimers} claimer(s)"
    if processes > 1:
        label = f"{processes} processes x {label}"
    if batch is not None:
        label += f", claim_batch {batch}"
    args: tuple[str, ...] = (
        "--threads",
        str(threads),
        "--claimers",
        str(claimers),
        "--processes",
        str(processes),
    )
    if batch is not None:
        args += ("--claim-batch", str(batch))
    if not fair:
        label += ", due order (tenant fairness off)"
        args += ("--due-order",)
    if spin:
        label += ", CPU-bound handler"
        args += ("--spin",)
    return Config(FENCEBRIDGE, label, threads * processes, args, spin)


def loop(threads: int, claimers: int, shape: str) -> Config:
    """The pool's statements in a bare loop (:mod:`bench.loop`): ``claimers`` loops sharing
    ``threads``, the settlements written beside the claim or within its transaction."""
    label = f"{claimers} x {threads // claimers} threads, settlements {shape} the claim"
    args = ("--threads", str(threads), "--claimers", str(claimers), "--loop", shape)
    return Config(LOOP, label, threads, args)


def pgqueuer(
    consumers: int, batch: int, limit: int = 0, max_tasks: int = 0, *, uvloop: bool = False
) -> Config:
    """``limit``: the entrypoint's ``concurrency_limit``; ``max_tasks``: ``max_concurrent_tasks``
    over all consumers (each gets its share). With neither, nothing bounds the jobs in flight.
    ``uvloop``: on uvloop's event loop."""
    label = f"{consumers} consumer(s) x batch {batch}"
    if limit:
        label += f", concurrency_limit {limit}"
    if max_tasks:
        label += f", max_concurrent_tasks {max_tasks}"
    if not limit and not max_tasks:
        label += ", no limit"
    if uvloop:
        label += ", uvloop"
    bounds = [b for b in (limit, max_tasks) if b]
    in_flight = min(bounds) if bounds else None
    args: tuple[str, ...] = (
        "--consumers",
        str(consumers),
        "--batch-size",
        str(batch),
        "--limit",
        str(limit),
        "--max-tasks",
        str(max_tasks),
        "--concurrency",
        str(in_flight or consumers * batch),
    )
    if uvloop:
        args += ("--uvloop",)
    return Config(PGQUEUER, label, in_flight, args)


def procrastinate(concurrency: int) -> Config:
    return Config(
        PROCRASTINATE,
        f"concurrency {concurrency}",
        concurrency,
        ("--concurrency", str(concurrency)),
    )


def awa(max_workers: int, claimers: int = 1) -> Config:
    """The queue's ``max_workers`` and ``claimers`` (dispatcher loops sharing its permits)."""
    return Config(
        AWA,
        f"max_workers {max_workers}, {claimers} claimer(s)",
        max_workers,
        ("--concurrency", str(max_workers), "--claimers", str(claimers)),
    )


#: DBOS's queue thread claims, then sleeps its polling interval (1 s by default): 10 ms, so that
#: the interval does not bound the rate at these concurrencies
DBOS_POLL_INTERVAL = 0.01


def dbos(worker_concurrency: int, poll_interval: float = DBOS_POLL_INTERVAL) -> Config:
    """The queue's ``worker_concurrency`` and ``polling_interval_sec``."""
    return Config(
        DBOS,
        f"worker_concurrency {worker_concurrency}, polling every {poll_interval * 1000:g} ms",
        worker_concurrency,
        ("--concurrency", str(worker_concurrency), "--poll-interval", str(poll_interval)),
    )


CEILING_CONFIG = Config(CEILING, "pgbench, 16 clients", 16)

#: the tenant-fairness comparison: one pool as `fencebridge run` runs it, claims fair and in due
#: order, on one tenant's queue (``--fairness`` drains these two alone, alternating)
FAIRNESS_ARMS: tuple[Config, ...] = (
    fencebridge(16, claimers=1),
    fencebridge(16, claimers=1, fair=False),
)

#: every configuration a full run drains
SWEEP: tuple[Config, ...] = (
    *FAIRNESS_ARMS,
    fencebridge(8, claimers=1),
    fencebridge(8, claimers=1, fair=False),
    fencebridge(16, claimers=1, batch=10),
    fencebridge(16, claimers=2),
    fencebridge(16, claimers=3),
    fencebridge(8, processes=2),
    fencebridge(16, spin=True),
    fencebridge(8, processes=2, spin=True),
    fencebridge(4, processes=4, spin=True),
    fencebridge(32),
    fencebridge(16, processes=2),
    loop(8, 1, BESIDE),
    loop(16, 1, BESIDE),
    loop(16, 1, WITHIN),
    loop(16, 2, WITHIN),
    pgqueuer(1, 4),
    pgqueuer(1, 8),
    pgqueuer(2, 4),
    pgqueuer(1, 16),
    pgqueuer(2, 8),
    pgqueuer(4, 4),
    pgqueuer(16, 1),
    pgqueuer(1, 10),
    pgqueuer(5, 10),
    pgqueuer(16, 10),
    pgqueuer(1, 16, uvloop=True),
    pgqueuer(1, 10, uvloop=True),
    pgqueuer(5, 10, uvloop=True),
    pgqueuer(1, 8, max_tasks=16, uvloop=True),
    pgqueuer(1, 10, limit=16),
    pgqueuer(2, 8, limit=16),
    pgqueuer(4, 4, limit=16),
    pgqueuer(1, 8, max_tasks=16),
    pgqueuer(2, 4, max_tasks=16),
    procrastinate(8),
    procrastinate(16),
    procrastinate(32),
    awa(8),
    awa(16),
    awa(16, claimers=2),
    awa(32, claimers=2),
    awa(32, claimers=4),
    awa(64, claimers=4),
    dbos(16),
    dbos(64),
    CEILING_CONFIG,
)


@dataclass(frozen=True)
class Plan:
    jobs: int
    warmup_jobs: int
    runs: int
    configs: tuple[Config, ...]


FULL = Plan(jobs=10_000, warmup_jobs=1_000, runs=3, configs=SWEEP)
QUICK = Plan(jobs=5_000, warmup_jobs=0, runs=1, configs=SWEEP)


# -- the fencebridge drain (runs in its own process, like the peers) ----------------------------


class Noop(ConditionalWriteHandler):
    """Writes nothing: the run is the claim and the fenced settlement alone."""

    def handle(self, ctx: Context) -> None:
        return None


#: pure-Python iterations of the CPU-bound handler: about a millisecond of one core here
SPIN_ITERATIONS = 20_000


class Spin(ConditionalWriteHandler):
    """Holds the GIL for a fixed amount of pure-Python work: a CPU-bound handler."""

    def handle(self, ctx: Context) -> None:
        total = 0
        for i in range(SPIN_ITERATIONS):
            total += i * i
        if total < 0:  # never: keeps the loop from being optimised away
            raise AssertionError(total)


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

    @property
    def left(self) -> int:
        """Jobs not settled yet."""
        with self._lock:
            return self._left

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

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        pass


def fencebridge_prepare(store: PostgresStore, jobs: int) -> None:
    body = json.dumps(PAYLOAD).encode()
    for start in range(0, jobs, ENQUEUE_BATCH):
        store.inbox.ingest(
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


def fencebridge_drain_process(  # noqa: PLR0917  (a process target takes positional arguments)
    url: str,
    threads: int,
    claimers: int,
    spin: bool,
    fair: bool,
    batch: int | None,
    left: Any,
    done: Any,
    problems: Any,
    shape: str | None = None,
    used: Any = None,
) -> None:
    """One pool in this process, draining until ``left`` (shared by every process) is zero.
    The store is opened as ``fencebridge run`` opens it (one plan per statement, no JIT,
    tenant fairness as configured). With ``shape``, the bare loop of :mod:`bench.loop`
    instead of the pool, on a store opened the same way.

    The CPU this process spends from opening its store to closing it is added to ``used``:
    the drain's CPU, as every peer's module counts its own (:func:`bench.peers.measure`), and
    not the interpreter's start and imports, which a spawned process pays before it."""
    started = cpu()
    try:
        _drain_in_process(url, threads, claimers, spin, fair, batch, left, done, problems, shape)
    finally:
        if used is not None:
            with used.get_lock():
                used.value += cpu() - started


def _drain_in_process(  # noqa: PLR0917  (as fencebridge_drain_process)
    url: str,
    threads: int,
    claimers: int,
    spin: bool,
    fair: bool,
    batch: int | None,
    left: Any,
    done: Any,
    problems: Any,
    shape: str | None,
) -> None:
    if shape is not None:
        size = 2 * claimers  # a claim and a settlement connection per claimer
        bare = PinnedStore(
            open_pool(url, min_size=size, max_size=size, generic_plans=True),
            policy=ClaimPolicy(fairness={} if fair else None),
        )
        try:
            bare.pool.wait()
            loop_drain(bare, threads, claimers, shape)
        finally:
            bare.close()
        return
    connections = threads + claimers + 1  # workers, claimers, heartbeater
    store = PostgresStore.connect(
        url,
        min_size=connections,
        max_size=connections,
        generic_plans=True,
        policy=ClaimPolicy(fairness={} if fair else None),
    )
    try:
        store.pool.wait()
        registry = Registry()
        registry.register(JOB_TYPE, Spin() if spin else Noop())
        settled = SharedSettled(left, done)
        pool = WorkerPool(
            store,
            registry,
            IdentityHasher.ephemeral(),
            worker_id=f"bench-{multiprocessing.current_process().pid}",
            threads=threads,
            claim_batch=batch,
            claimers=claimers,
            events=settled,
        )
        settle_in()  # as `fencebridge run` does before it starts
        pool.start()
        done.wait(DRAIN_TIMEOUT)
        pool.stop()
        settled.close()
        with problems.get_lock():
            problems.value += settled.problems
    finally:
        store.close()


class SharedSettled(Settled):
    """:class:`Settled` over a count shared by the drain's processes.

    The runs count in this process only (the pool's own lock-free counts); a thread publishes
    them to the shared count every 20 milliseconds. Touching the shared count, a lock between
    processes, once per job would cost the drain more than the peers' harnesses cost theirs.
    The rate is read from the database's timestamps, so publishing late changes no figure.
    """

    PUBLISH_EVERY = 0.02

    def __init__(self, left: Any, done: Any) -> None:
        super().__init__(0)
        self._shared = left
        self.done = done
        self._counts = EventCounter()
        self._stop = threading.Event()
        self._publisher = threading.Thread(target=self._publish, daemon=True)
        self._publisher.start()

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self._counts.settled(claim, state, code)

    def close(self) -> None:
        self._stop.set()
        self._publisher.join()

    def _publish(self) -> None:
        published = 0
        while not self._stop.wait(self.PUBLISH_EVERY):
            now = sum(
                n for name, n in self._counts.snapshot().items() if name.startswith("settled.")
            )
            if now == published:
                continue
            with self._shared.get_lock():
                self._shared.value -= now - published
                if self._shared.value <= 0:
                    self.done.set()
            published = now


def fencebridge_drain(  # noqa: PLR0917
    url: str,
    jobs: int,
    threads: int,
    claimers: int,
    processes: int,
    spin: bool = False,
    fair: bool = True,
    batch: int | None = None,
    shape: str | None = None,
) -> Drain:
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    store = PostgresStore.connect(url, min_size=1, max_size=2)
    try:
        fencebridge_prepare(store, jobs)
    finally:
        store.close()
    settle_database(url)
    context = multiprocessing.get_context("spawn")
    left, done, problems = context.Value("l", jobs), context.Event(), context.Value("l", 0)
    used = context.Value("d", 0.0)
    children = [
        context.Process(
            target=fencebridge_drain_process,
            args=(url, threads, claimers, spin, fair, batch, left, done, problems, shape, used),
        )
        for _ in range(processes)
    ]
    started = time.perf_counter()
    for child in children:
        child.start()
    for child in children:
        child.join(DRAIN_TIMEOUT)
    wall = time.perf_counter() - started
    if problems.value:
        log(f"fencebridge: {problems.value} run(s) did not settle")
    with psycopg.connect(url, autocommit=True) as conn:
        return summarize(
            conn,
            FENCEBRIDGE_PAIRS,
            system=FENCEBRIDGE if shape is None else LOOP,
            concurrency=threads * processes,
            jobs=jobs,
            wall=wall,
            cpu=used.value,
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


def drain(admin_url: str, config: Config, jobs: int) -> Drain:
    """One drain of one configuration in a process of its own, on a database of its own."""
    if config.system == CEILING:
        with bench_database(admin_url, "ceiling") as url:
            rate = claim_settle_ceiling(url, jobs, config.in_flight or IN_FLIGHT)
        return Drain(CEILING, config.in_flight, jobs, rate.rows, rate.seconds, 0, 0, 0, 0)
    with empty_database(admin_url, config.system) as name:
        url = database_url(admin_url, name)
        command = [
            sys.executable,
            "-m",
            MODULES[config.system],
            "--database-url",
            url,
            "--jobs",
            str(jobs),
            *config.args,
        ]
        if config.system in {FENCEBRIDGE, LOOP}:
            command.append("--drain")
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=DRAIN_TIMEOUT, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"{config.system} ({config.label}) drain failed ({done.returncode}):\n"
            f"{done.stderr[-4000:]}"
        )
    result = Drain(**json.loads(done.stdout.strip().splitlines()[-1]))
    if result.settled != jobs:
        raise RuntimeError(f"{config.system} ({config.label}) settled {result.settled} of {jobs}")
    if result.ran_once is not None and (result.ran_once != jobs or result.ran_again):
        log(
            f"{config.system} ({config.label}): {result.ran_once} of {jobs} jobs ran once, "
            f"{result.ran_again} run(s) beyond the first"
        )
    return result


def median_rate(drains: Sequence[Drain]) -> float:
    return statistics.median(d.rate for d in drains)


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    drains: dict[Config, list[Drain]] = field(default_factory=dict)

    def peak(self, config: Config) -> int:
        """The most jobs the configuration had in flight, over all its rounds."""
        return max(d.peak_in_flight for d in self.drains[config])

    def best(self, system: str, in_flight: int | None = None) -> Config | None:
        """The fastest configuration of ``system``; with ``in_flight``, among those whose
        measured peak stayed within it in every round."""
        found = [
            c
            for c in self.drains
            if c.system == system
            and not c.spin
            and (in_flight is None or self.peak(c) <= in_flight)
        ]
        return max(found, key=lambda c: median_rate(self.drains[c]), default=None)

    def markdown(self) -> str:
        lines = [
            f"{self.plan.runs} measured round(s) of {self.plan.jobs:,} no-op jobs per "
            "configuration (after a warm-up round"
            + (f" of {self.plan.warmup_jobs:,} jobs" if self.plan.warmup_jobs else ": none")
            + "). Medians with min..max; jobs/s and latencies by the database clock, "
            "first pick to last settlement; in flight: the bound the configuration sets "
            "(none: nothing bounds it), then the jobs picked and not yet settled measured from "
            "the same records, the peak over all rounds and the median of the means; CPU: the "
            "draining process(es) from opening their connections to closing them (every "
            "thread, not the interpreter's start and imports), milliseconds per job; "
            "ran once: where the handler counts its runs, the jobs that ran exactly once "
            "(the fewest in a round), then the runs beyond the first over all rounds "
            "(-: not counted).",
            "",
            *facts_table(self.facts),
            "",
            "| system | configuration | bound | peak in flight | mean in flight | jobs/s "
            "| p50 ms | p99 ms | CPU ms/job | ran once |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for config in self.plan.configs:
            runs = self.drains.get(config, [])
            if not runs:
                continue
            cpu_ms = statistics.median(d.cpu_seconds * 1000 / d.jobs for d in runs)
            bound = "none" if config.in_flight is None else str(config.in_flight)
            measured = (
                "- | - |"
                if config.system == CEILING
                else f"{self.peak(config)} | "
                f"{statistics.median(d.mean_in_flight for d in runs):.1f} |"
            )
            lines.append(
                f"| {config.system} | {config.label} | {bound} | {measured} "
                f"{_cell([d.rate for d in runs], 0)} | "
                + (
                    "- | - | - | - |"
                    if config.system == CEILING
                    else f"{_cell([d.p50_ms for d in runs], 1)} | "
                    f"{_cell([d.p99_ms for d in runs], 1)} | {cpu_ms:.2f} | {_once(runs)} |"
                )
            )
        goals = self.goals()
        if goals:
            lines += ["", *goals]
        return "\n".join(lines) + "\n"

    def goals(self) -> list[str]:
        """Each system's best within :data:`IN_FLIGHT` and overall; with fencebridge's, the
        ratios to it, the bare loop and the ceiling."""
        ours = self.best(FENCEBRIDGE, IN_FLIGHT)
        mine = median_rate(self.drains[ours]) if ours is not None else None
        out: list[str] = []
        overall = self.best(FENCEBRIDGE)
        if ours is not None:
            out.append(
                f"- fencebridge's best within {IN_FLIGHT} in flight: {ours.label} (peak "
                f"{self.peak(ours)}), {mine:,.0f} jobs/s."
            )
            if overall is not None and overall != ours:
                out.append(
                    f"- fencebridge's best overall: {overall.label} (peak "
                    f"{self.peak(overall)}), {median_rate(self.drains[overall]):,.0f} jobs/s."
                )
        for peer in PEERS:
            out += self.peer_goals(peer, mine)
        if ours is None or mine is None:
            return out
        bare = self.best(LOOP, IN_FLIGHT)
        if bare is not None:
            theirs = median_rate(self.drains[bare])
            out.append(
                f"- the bare loop's best within {IN_FLIGHT} in flight (the same statements, "
                f"no pool): {bare.label}, {theirs:,.0f} jobs/s; the pool at {mine / theirs:.2f}x."
            )
        ceiling = self.best(CEILING)
        if ceiling is not None:
            top = median_rate(self.drains[ceiling])
            line = (
                f"- the ceiling (pgbench, fencebridge's claim.sql + settle_many.sql, "
                f"{ceiling.in_flight} clients): {top:,.0f} rows/s; the pool within "
                f"{IN_FLIGHT} at {mine / top:.2f}x"
            )
            if overall is not None and overall != ours:
                line += f", its best overall at {median_rate(self.drains[overall]) / top:.2f}x"
            out.append(line + ".")
        return out

    def peer_goals(self, peer: str, mine: float | None) -> list[str]:
        """A peer's best within :data:`IN_FLIGHT` (or the least it had in flight, where none
        stayed within) and overall, with fencebridge's best within as a ratio where it ran."""
        configs = [c for c in self.drains if c.system == peer]
        if not configs:
            return []
        out = []
        for in_flight, what in ((IN_FLIGHT, f"within {IN_FLIGHT} in flight"), (None, "overall")):
            best = self.best(peer, in_flight)
            if best is None:
                least = min(configs, key=self.peak)
                out.append(
                    f"- {peer}: no configuration stayed within {IN_FLIGHT} in flight (the "
                    f"least: {least.label}, peak {self.peak(least)})."
                )
                continue
            theirs = median_rate(self.drains[best])
            line = (
                f"- {peer}'s best {what}: {best.label} (peak {self.peak(best)} in flight), "
                f"{theirs:,.0f} jobs/s"
            )
            once = _once(self.drains[best])
            if once != "-":
                line += f", ran once: {once}"
            if mine is not None:
                line += f"; fencebridge's best within {IN_FLIGHT} / {peer}: {mine / theirs:.2f}x"
            out.append(line + ".")
        return out


def _once(runs: Sequence[Drain]) -> str:
    """The jobs that ran exactly once (the fewest in a round) and the runs beyond the first
    (all rounds), where the drain counted them."""
    counted = [d for d in runs if d.ran_once is not None]
    if not counted:
        return "-"
    once = min(d.ran_once or 0 for d in counted)
    again = sum(d.ran_again or 0 for d in counted)
    return f"{once:,} of {counted[0].jobs:,}, {again} again"


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


def rotate(items: Sequence[Config], k: int) -> list[Config]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def run(
    database_url: str | None, plan: Plan, argv: list[str], enable_autovacuum: bool = False
) -> Report:
    report = Report(plan)
    with (
        server(database_url) as admin_url,
        autovacuum_on(admin_url, enable_autovacuum),
        report_facts(admin_url, argv, ("peers", versions())) as facts,
    ):
        report.facts = facts
        if plan.warmup_jobs:
            for config in plan.configs:
                log(f"warm-up: {config.system} ({config.label})")
                drain(admin_url, config, plan.warmup_jobs)
        for k in range(plan.runs):
            for config in rotate(plan.configs, k * 5):
                result = drain(admin_url, config, plan.jobs)
                log(
                    f"round {k + 1}: {config.system} ({config.label}): "
                    f"{result.rate:,.0f} jobs/s, p50 {result.p50_ms:.1f} ms, "
                    f"p99 {result.p99_ms:.1f} ms (wall {result.wall_seconds:.1f}s)"
                )
                report.drains.setdefault(config, []).append(result)
    return report


def options() -> argparse.ArgumentParser:
    parser = arguments(
        "bench.workers",
        "The worker tier beside PgQueuer, Procrastinate, Awa and DBOS, no-op jobs.",
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain")
    parser.add_argument("--runs", type=int, help="measured rounds")
    parser.add_argument(
        "--enable-autovacuum",
        action="store_true",
        help="turn autovacuum on for the run if the server has it off (ALTER SYSTEM)",
    )
    parser.add_argument("--system", choices=SYSTEMS, action="append", help="(repeatable)")
    parser.add_argument(
        "--fairness",
        action="store_true",
        help="only fencebridge's 16 threads with tenant fairness on and off, alternating",
    )
    parser.add_argument(
        "--drain", action="store_true", help="internal: one fencebridge drain, JSON on stdout"
    )
    parser.add_argument("--threads", type=int, default=IN_FLIGHT, help="internal, with --drain")
    parser.add_argument("--claimers", type=int, help="internal, with --drain")
    parser.add_argument("--processes", type=int, default=1, help="internal, with --drain")
    parser.add_argument("--claim-batch", type=int, help="internal, with --drain")
    parser.add_argument("--spin", action="store_true", help="internal: the CPU-bound handler")
    parser.add_argument("--loop", choices=SHAPES, help="internal: the bare loop, not the pool")
    parser.add_argument(
        "--due-order", action="store_true", help="internal: claims without tenant fairness"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, command = command_line(options(), argv)
    if args.drain:
        emit(
            fencebridge_drain(
                args.database_url,
                args.jobs,
                args.threads,
                args.claimers or CLAIMERS_DEFAULT,
                args.processes,
                args.spin,
                not args.due_order,
                args.claim_batch,
                args.loop,
            )
        )
        return 0
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.jobs:
        overrides["jobs"] = args.jobs
    if args.runs:
        overrides["runs"] = args.runs
    if args.system:
        overrides["configs"] = tuple(c for c in plan.configs if c.system in args.system)
    if args.fairness:
        overrides["configs"] = FAIRNESS_ARMS
    plan = replace(plan, **overrides)
    print(run(args.database_url, plan, command, args.enable_autovacuum).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
