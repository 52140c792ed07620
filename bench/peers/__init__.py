"""One drain of one system, run in a process of its own by :mod:`bench.workers`.

Every module here (and ``bench.workers --drain``) does the same thing for its system: install
its schema in the empty database it is given, queue the jobs with the system's own batch API,
``VACUUM ANALYZE`` and ``CHECKPOINT``, then drain the queue with a no-op handler at the
requested concurrency and print one :class:`Drain` as a JSON line on stdout.

The figures come from the database clock and the system's own records, read the same way for
every system: the moment each job was picked (claimed) and the moment it was settled (completed),
each the ``now()`` of the statement's transaction that did it. The rate is the job count over
the time from the first pick to the last settlement; the latency is settlement minus pick, per
job. The peers are imported only here, so they stay out of the project's dependencies.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

#: a job's payload: about 100 bytes of JSON, the same for every system
PAYLOAD = {"amount": 1250, "currency": "EUR", "note": "x" * 48, "ref": "bench-0000000000"}
ENQUEUE_BATCH = 1000

#: pick-to-settle percentiles, first pick and last settlement, from per-job timestamp pairs
#: given as a query yielding (picked, settled)
SUMMARY = """
WITH t AS ({pairs})
SELECT count(*),
       extract(epoch FROM max(settled) - min(picked)),
       1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM settled - picked)),
       1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM settled - picked)),
       sum(extract(epoch FROM settled - picked))
           / nullif(extract(epoch FROM max(settled) - min(picked)), 0)
  FROM t
"""

#: the most jobs picked and not yet settled at any one moment, by the same records: a job
#: counts from its pick to its settlement, and where one transaction settles some jobs and
#: picks others (the same ``now()``), the settlements are counted first
PEAK_IN_FLIGHT = """
WITH t AS ({pairs}),
change AS (SELECT picked AS at, 1 AS delta FROM t UNION ALL SELECT settled, -1 FROM t)
SELECT max(in_flight)
  FROM (SELECT sum(delta) OVER (ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS in_flight
          FROM change) c
"""


@dataclass
class Drain:
    """What one drain measured. Times in seconds, latencies in milliseconds."""

    system: str
    concurrency: int
    jobs: int
    #: jobs the system recorded as settled successfully
    settled: int
    #: first pick to last settlement, by the database clock
    seconds: float
    p50_ms: float
    p99_ms: float
    #: this process, from starting the workers until they returned (startup and shutdown too)
    wall_seconds: float
    #: client CPU (this process, every thread) while draining
    cpu_seconds: float
    #: jobs picked and not yet settled, by the database's records: the most at one moment,
    #: and the mean over the drain (the sum of pick-to-settle times over the drain's time)
    peak_in_flight: int = 0
    mean_in_flight: float = 0.0
    #: correctness, where the module counts it (None: not counted): the jobs whose handler ran
    #: exactly once, and the runs beyond the first over all jobs, counted by the handler itself
    ran_once: int | None = None
    ran_again: int | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


def summarize(
    conn: psycopg.Connection[Any],
    pairs: str,
    *,
    system: str,
    concurrency: int,
    jobs: int,
    wall: float,
    cpu: float,
) -> Drain:
    conn.execute("ANALYZE")  # fresh statistics for the read-back, whatever the drain wrote
    row = conn.execute(SUMMARY.format(pairs=pairs).encode()).fetchone()
    assert row is not None
    settled, seconds, p50, p99, mean = row
    peak = conn.execute(PEAK_IN_FLIGHT.format(pairs=pairs).encode()).fetchone()
    return Drain(
        system=system,
        concurrency=concurrency,
        jobs=jobs,
        settled=int(settled),
        seconds=float(seconds or 0.0),
        p50_ms=float(p50 or 0.0),
        p99_ms=float(p99 or 0.0),
        wall_seconds=wall,
        cpu_seconds=cpu,
        peak_in_flight=int(peak[0] or 0) if peak is not None else 0,
        mean_in_flight=float(mean or 0.0),
    )


class Runs:
    """Each job's handler runs, counted by the handler in the draining process (every run
    of a drain happens in that one process): what "each job once" is checked against."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[Hashable] = Counter()

    def ran(self, key: Hashable) -> None:
        with self._lock:
            self._counts[key] += 1

    def tally(self) -> tuple[int, int]:
        """The jobs that ran exactly once, and the runs beyond the first over all jobs."""
        with self._lock:
            counts = list(self._counts.values())
        return sum(1 for n in counts if n == 1), sum(n - 1 for n in counts if n > 1)


def settle_database(url: str) -> None:
    """Fresh statistics and a checkpoint before the drain, as for every system."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def emit(drain: Drain) -> None:
    print(json.dumps(asdict(drain)), flush=True)


def parse(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--database-url", required=True, help="an empty database")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--batch-size", type=int, help="rows per dequeue, where the system has one")
    parser.add_argument(
        "--consumers", type=int, help="consumer instances, where the system has them"
    )
    parser.add_argument("--limit", type=int, help="a concurrency limit, where the system has one")
    parser.add_argument(
        "--max-tasks", type=int, help="a cap on the jobs picked at once, where the system has one"
    )
    parser.add_argument(
        "--uvloop", action="store_true", help="uvloop's event loop, where the system is asyncio"
    )
    parser.add_argument("--claimers", type=int, help="claim loops, where the system has them")
    parser.add_argument(
        "--poll-interval", type=float, help="seconds between polls, where the system polls"
    )
    return parser.parse_args(sys.argv[1:] if argv is None else argv)


def cpu() -> float:
    """This process's CPU time so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(
    args: argparse.Namespace,
    pairs: str,
    *,
    system: str,
    prepare: Callable[[], None],
    drain: Callable[[], None],
    runs: Runs | None = None,
) -> int:
    """One drain as every peer module runs it: prepare, settle, time the drain, emit the result
    (with ``runs``, the handler's own count of each job's runs)."""
    prepare()
    settle_database(args.database_url)
    started, cpu_started = time.perf_counter(), cpu()
    drain()
    wall, used = time.perf_counter() - started, cpu() - cpu_started
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        result = summarize(
            conn,
            pairs,
            system=system,
            concurrency=args.concurrency,
            jobs=args.jobs,
            wall=wall,
            cpu=used,
        )
    if runs is not None:
        result.ran_once, result.ran_again = runs.tally()
    emit(result)
    return 0
