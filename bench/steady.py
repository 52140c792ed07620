"""Steady state: a fixed offered load for ``--minutes`` beside a million terminal rows.

The database starts with 1,000,000 ``succeeded`` rows (settled when the run starts). One
producer thread offers ``--rate`` deliveries per second through
:class:`~bridge.ingest.inbox.Inbox` in batches of 10, on a fixed schedule (a batch that falls behind
is sent at once, never dropped); a :class:`~bridge.runtime.worker.WorkerPool` of 16 threads drains
them (no-op class B handler); the purge runs beside it
(:meth:`~bridge.store.PostgresStore.purge_batch`, batches of ``PURGE_BATCH`` every second, rows
older than ``--retention``), so from then on the oldest terminal rows are deleted while new ones
arrive; autovacuum must be on.

Every 30 s window reports: deliveries offered and settled per second, the latency of the
pool's claim transactions (each claim, claim of handed-off keys, or settle-and-claim, as the
pool calls it, median and p99 by this process's clock), and ``work_item``'s dead tuples and
the sizes of its partial indexes (``pg_stat_user_tables``, ``pg_relation_size``). The report
compares the last window with the first; the target is no window below 0.8x the first::

    python -m bench.steady                     # 15 minutes at 500 deliveries/s
    python -m bench.steady --quick             # 2 minutes, 100,000 terminal rows
    python -m bench.steady --minutes 5 --rate 1000 --enable-autovacuum
    python -m bench.steady --pressure 5        # then the MVCC-horizon phases, 5 minutes each

With ``--pressure MINUTES``, the steady run (the baseline) is followed by two phases that hold
the MVCC horizon back, as a forgotten session or a report's long reader does in production,
each followed by a recovery of :data:`RECOVERY_SECONDS`: **idle in transaction** (one session
that took a snapshot and then sits, idle, in its open transaction) and **long readers**
(``REPEATABLE READ`` transactions of ``--pressure`` / 2 each, one started every 30 s, so two
always overlap, each reading the table once and then holding its snapshot). While the horizon
is held, no dead row of ``work_item`` may be removed by vacuum, so every settled and purged
row stays in the table and its indexes. Each window names its phase; the report gives each
phase's lowest window against the baseline's mean, the claim's p99 in it, and the first
window after each phase back at 0.98x. Targets (the queue's own): every window under
pressure at 0.9x the baseline or more, back at 0.98x within 60 s, claim p99 at most 20 ms.

With ``--enable-autovacuum`` a server whose autovacuum is off gets it turned on for the run
(``ALTER SYSTEM``, reset afterwards); without it such a server is refused. Without a server
(no ``--database-url`` nor ``$FENCEBRIDGE_DATABASE_URL``) the run starts an embedded one, whose
autovacuum is on.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import psycopg

from bench.inbox import BATCH, THREADS, decoder
from bench.store import (
    BODY,
    arguments,
    autovacuum_on,
    bench_database,
    command_line,
    facts_table,
    fill_history,
    log,
    report_facts,
    server,
)
from bench.workers import JOB_TYPE, Noop, Settled
from bridge.executors.registry import Registry
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.runtime.collector import settle_in
from bridge.runtime.worker import CLAIMERS_DEFAULT, WorkerPool
from bridge.service import Supervised
from bridge.store import PostgresStore
from bridge.types import RawDelivery

WINDOW_SECONDS = 30.0
PURGE_BATCH = 1000
#: the windows after a pressure phase watched for the recovery
RECOVERY_SECONDS = 120.0
#: the phases' names, as the windows give them
BASELINE, IDLE_IN_TRANSACTION, LONG_READERS, RECOVERY = (
    "baseline",
    "idle in transaction",
    "long readers",
    "recovery",
)
#: a long reader starts every so often, so that two overlap
READER_EVERY_SECONDS = 30.0
#: the partial indexes whose dead entries a claim or a purge walks through
INDEXES = ("work_item_due", "work_item_lease", "work_item_terminal")

TABLE_STATS = """
SELECT n_dead_tup, n_live_tup, autovacuum_count,
       (SELECT coalesce(sum(pg_relation_size(i::regclass)), 0)
          FROM unnest(%(indexes)s::text[]) AS i)
  FROM pg_stat_user_tables WHERE relname = 'work_item'
"""


@dataclass(frozen=True)
class Plan:
    minutes: float
    rate: int
    history_rows: int
    retention: timedelta
    #: length of each MVCC-horizon phase after the baseline (None: no such phases)
    pressure: timedelta | None = None


FULL = Plan(minutes=15, rate=500, history_rows=1_000_000, retention=timedelta(minutes=5))
QUICK = Plan(minutes=2, rate=300, history_rows=100_000, retention=timedelta(seconds=30))


class Latencies:
    """Durations of the pool's claim transactions, taken per window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[float] = []

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                with self._lock:
                    self._seen.append(time.perf_counter() - started)

        return timed

    def take(self) -> list[float]:
        with self._lock:
            seen, self._seen = self._seen, []
        return seen


class Producer:
    """Offers deliveries at a fixed rate, in batches of 10, on a schedule it never drops."""

    def __init__(self, inbox: Inbox, rate: int) -> None:
        self._inbox = inbox
        self._interval = BATCH / rate
        self._next = time.monotonic()
        self._sent = 0
        self.stop = threading.Event()
        self.offered = 0
        self.service = Supervised("producer", self.round, stop=self.stop)

    def round(self) -> None:
        pause = self._next - time.monotonic()
        if pause > 0 and self.stop.wait(pause):
            return
        start = self._sent
        self._inbox.write(
            [
                RawDelivery(
                    subscription="steady",
                    message_id=f"s-{i}",
                    body=BODY,
                    attributes={"tenant": "bench", "operation": f"s-{i}"},
                )
                for i in range(start, start + BATCH)
            ]
        )
        self._sent += BATCH
        self.offered = self._sent
        self._next += self._interval


@dataclass(frozen=True)
class Window:
    phase: str
    at: float
    offered: float
    settled: float
    claim_p50_ms: float
    claim_p99_ms: float
    dead: int
    live: int
    autovacuums: int
    index_mb: float


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    purged: int = 0

    def markdown(self) -> str:
        lines = [
            f"{self.plan.minutes:g} minutes at {self.plan.rate:,} deliveries/s offered, beside "
            f"{self.plan.history_rows:,} terminal rows; purge of rows older than "
            f"{self.plan.retention.total_seconds():.0f}s in batches of {PURGE_BATCH:,} every "
            f"second ({self.purged:,} rows purged); pool of {THREADS} threads; "
            f"{WINDOW_SECONDS:.0f} s windows.",
            "",
            *facts_table(self.facts),
            "",
            "| phase | window end (s) | offered/s | settled/s | claim p50 ms | claim p99 ms | "
            "dead tuples | live tuples | autovacuums | partial indexes MB |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for w in self.windows:
            lines.append(
                f"| {w.phase} | {w.at:.0f} | {w.offered:,.0f} | {w.settled:,.0f} | "
                f"{w.claim_p50_ms:.1f} | {w.claim_p99_ms:.1f} | {w.dead:,} | {w.live:,} | "
                f"{w.autovacuums} | {w.index_mb:.1f} |"
            )
        baseline = [w for w in self.windows if w.phase == BASELINE]
        if baseline:
            first = baseline[0].settled
            low = min(w.settled for w in baseline)
            last = baseline[-1]
            lines += [
                "",
                f"Lowest window at {low / first:.2f}x the first; claim p50 "
                f"{baseline[0].claim_p50_ms:.1f} ms in the first window, "
                f"{last.claim_p50_ms:.1f} ms in the last.",
            ]
        lines += self._pressure_summary(baseline)
        return "\n".join(lines) + "\n"

    def _pressure_summary(self, baseline: list[Window]) -> list[str]:
        """Each pressure phase against the baseline's mean (its first window left out: the
        pool warming up), and how soon the recovery after it was back at 0.98x."""
        phases = [p for p in (IDLE_IN_TRANSACTION, LONG_READERS) if self._of(p)]
        if not phases or len(baseline) < 2:
            return []
        mean = statistics.mean(w.settled for w in baseline[1:])
        lines = ["", f"Baseline: {mean:,.0f} settled/s (mean of its windows after the first)."]
        for phase in phases:
            held = self._of(phase)
            low = min(w.settled for w in held)
            p99 = max(w.claim_p99_ms for w in held)
            dead = max(w.dead for w in held)
            back = self._back_after(phase, mean)
            lines.append(
                f"- {phase}: lowest window {low / mean:.2f}x the baseline, claim p99 at most "
                f"{p99:.1f} ms, dead tuples up to {dead:,}; "
                + (
                    f"back at 0.98x in the window ending {back:.0f} s after the phase"
                    if back is not None
                    else "not back at 0.98x within the recovery"
                )
            )
        return lines

    def _of(self, phase: str) -> list[Window]:
        return [w for w in self.windows if w.phase == phase]

    def _back_after(self, phase: str, mean: float) -> float | None:
        """Seconds from the phase's end to the end of the first recovery window at 0.98x."""
        ended: float | None = None
        for w in self.windows:
            if w.phase == phase:
                ended = w.at
            elif ended is not None and w.phase == RECOVERY:
                if w.settled >= 0.98 * mean:
                    return w.at - ended
            elif ended is not None:
                return None
        return None


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@contextmanager
def idle_in_transaction(url: str) -> Iterator[None]:
    """One session that takes a transaction id and a snapshot, then sits idle in its open
    transaction: the horizon stays where it was until it ends."""
    conn = psycopg.connect(url)
    try:
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT txid_current(), count(*) FROM work_item")
        yield
    finally:
        conn.rollback()
        conn.close()


@contextmanager
def long_readers(url: str, hold: float) -> Iterator[None]:
    """``REPEATABLE READ`` readers of ``hold`` seconds each, one started every
    :data:`READER_EVERY_SECONDS`: each reads the table once and keeps its snapshot open."""
    stop = threading.Event()
    open_readers: list[tuple[float, psycopg.Connection[Any]]] = []

    def round_() -> None:
        now = time.monotonic()
        for ends, conn in [r for r in open_readers if r[0] <= now]:
            open_readers.remove((ends, conn))
            conn.rollback()
            conn.close()
        conn = psycopg.connect(url)
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*), max(updated_at) FROM work_item")
        open_readers.append((now + hold, conn))

    readers = Supervised("long readers", round_, every=READER_EVERY_SECONDS, stop=stop)
    readers.start()
    try:
        yield
    finally:
        stop.set()
        readers.stop(10)
        for _, conn in open_readers:
            conn.rollback()
            conn.close()


class Windows:
    """Takes a 30 s window of the run at a time, each under the phase it ran in."""

    def __init__(self, url: str, producer: Producer, settled: Settled, latencies: Latencies):
        self._conn = psycopg.connect(url, autocommit=True)
        self._producer = producer
        self._settled = settled
        self._latencies = latencies
        self._started = time.monotonic()
        self._next = self._started
        self._last_offered, self._last_left = 0, settled.left

    def watch(self, phase: str, seconds: float, report: Report) -> None:
        for _ in range(max(1, round(seconds / WINDOW_SECONDS))):
            self._next += WINDOW_SECONDS
            time.sleep(max(0.0, self._next - time.monotonic()))
            offered, left = self._producer.offered, self._settled.left
            seen = self._latencies.take()
            stats = self._conn.execute(TABLE_STATS, {"indexes": list(INDEXES)}).fetchone()
            assert stats is not None
            window = Window(
                phase=phase,
                at=time.monotonic() - self._started,
                offered=(offered - self._last_offered) / WINDOW_SECONDS,
                settled=(self._last_left - left) / WINDOW_SECONDS,
                claim_p50_ms=statistics.median(seen) * 1000 if seen else 0.0,
                claim_p99_ms=_percentile(seen, 0.99),
                dead=int(stats[0]),
                live=int(stats[1]),
                autovacuums=int(stats[2]),
                index_mb=int(stats[3]) / 1024 / 1024,
            )
            log(
                f"{window.at:.0f}s ({phase}): settled {window.settled:,.0f}/s, claim p50 "
                f"{window.claim_p50_ms:.1f} ms, p99 {window.claim_p99_ms:.1f} ms, "
                f"dead {window.dead:,}"
            )
            report.windows.append(window)
            self._last_offered, self._last_left = offered, left

    def close(self) -> None:
        self._conn.close()


def steady(url: str, plan: Plan, report: Report) -> None:
    log(f"filling {plan.history_rows:,} terminal rows")
    fill_history(url, plan.history_rows)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE work_item SET settled_at = now(), updated_at = now()")
        conn.execute("VACUUM ANALYZE work_item")
    size = THREADS + CLAIMERS_DEFAULT + 1 + 1 + 1 + 2
    store = PostgresStore.connect(url, min_size=size, max_size=size)
    latencies = Latencies()
    claims = store.claims
    claims.claim = latencies.wrap(claims.claim)  # type: ignore[method-assign]
    claims.claim_keys = latencies.wrap(claims.claim_keys)  # type: ignore[method-assign]
    claims.settle_and_claim = latencies.wrap(  # type: ignore[method-assign]
        claims.settle_and_claim
    )
    stop_purge = threading.Event()

    def purge_round() -> None:
        counts = store.operator.purge_batch(plan.retention, PURGE_BATCH)
        if counts is not None:
            report.purged += counts.work_rows

    purger = Supervised("purge", purge_round, every=1.0, stop=stop_purge)
    try:
        store.pool.wait()
        registry = Registry()
        registry.register(JOB_TYPE, Noop())
        settled = Settled(10**12)
        pool = WorkerPool(
            store, registry, IdentityHasher.ephemeral(), worker_id="bench", events=settled
        )
        producer = Producer(Inbox(store.inbox, decoder, pool=pool), plan.rate)
        settle_in()  # as `fencebridge run` does before it starts
        pool.start()
        purger.start()
        producer.service.start()
        windows = Windows(url, producer, settled, latencies)
        try:
            windows.watch(BASELINE, plan.minutes * 60, report)
            if plan.pressure is not None:
                length = plan.pressure.total_seconds()
                with idle_in_transaction(url):
                    windows.watch(IDLE_IN_TRANSACTION, length, report)
                windows.watch(RECOVERY, RECOVERY_SECONDS, report)
                with long_readers(url, length / 2):
                    windows.watch(LONG_READERS, length, report)
                windows.watch(RECOVERY, RECOVERY_SECONDS, report)
        finally:
            windows.close()
        producer.stop.set()
        producer.service.stop(10)
        pool.stop()
    finally:
        stop_purge.set()
        purger.stop(10)
        store.close()


def run(database_url: str | None, plan: Plan, argv: list[str], enable: bool) -> Report:
    report = Report(plan)
    with (
        server(database_url) as admin_url,
        autovacuum_on(admin_url, enable),
        report_facts(admin_url, argv) as facts,
    ):
        report.facts = facts
        with bench_database(admin_url, "steady") as url:
            steady(url, plan, report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.steady", "A fixed offered load beside a million terminal rows.")
    parser.add_argument("--minutes", type=float, help="length of the run")
    parser.add_argument("--rate", type=int, help="deliveries offered per second")
    parser.add_argument("--history-rows", type=int, help="terminal rows present at the start")
    parser.add_argument(
        "--pressure",
        type=float,
        metavar="MINUTES",
        help="after the run, the MVCC-horizon phases of this many minutes each",
    )
    parser.add_argument(
        "--enable-autovacuum",
        action="store_true",
        help="turn autovacuum on for the run if the server has it off (ALTER SYSTEM)",
    )
    args, command = command_line(parser, argv)
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.minutes:
        overrides["minutes"] = args.minutes
    if args.rate:
        overrides["rate"] = args.rate
    if args.history_rows:
        overrides["history_rows"] = args.history_rows
    if args.pressure:
        overrides["pressure"] = timedelta(minutes=args.pressure)
    plan = replace(plan, **overrides)
    print(run(args.database_url, plan, command, args.enable_autovacuum).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
