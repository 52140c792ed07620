"""Awa: drain the queue with a no-op Python worker (see :mod:`bench.peers`).

Awa (PyPI ``awa-pg``) is a Rust engine driven from Python: its dispatchers claim, heartbeat
and complete in Rust, and hand each job to the Python handler; a completion carries the claim's
``run_lease``, so a stale worker's completion is fenced out. The schema is Awa's migrations
(``migrate``) with its queue-storage engine installed and active (``install_queue_storage``,
what a fresh install's first worker selects), and the jobs are queued with its COPY batch API
(``enqueue_many_copy``). The knobs its docs name for a hot queue, swept by
:mod:`bench.workers`:

* ``--concurrency``: the queue's ``max_workers`` (jobs a runtime runs at once);
* ``--claimers``: the queue's ``claimers``, dispatcher loops sharing those permits (the docs:
  "benchmark 2 or 4 before raising it further");
* ``--batch-size``: the queue's ``claim_batch_size`` (Awa's default when not given; the sweep
  leaves it there: at 16 workers, 32 was no faster in trials, and 4 half as fast).

The client's connection pool holds ``max_workers`` plus the claimers plus four connections, so
the pool never caps the workers. The drain returns once Awa's completion records hold every job
(polled every 20 ms). Pick and settlement: a completion batch row of the receipt plane
(``receipt_completion_batches``) records each job's attempt time (its claim) and the batch's
``finalized_at``; Awa stamps both with ``clock_timestamp()``. Completions written the wide way
(``done_entries``) are read too, so a job settled either way counts once per record: a job
completed twice would show as more settlements than jobs. The handler counts each job's runs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import awa
import psycopg

from bench.peers import ENQUEUE_BATCH, PAYLOAD, Runs, measure, parse

SYSTEM = "awa"
QUEUE = "bench"
#: connections beside one per worker and per claimer (the runtime's own upkeep)
SPARE_CONNECTIONS = 4
POLL = 0.02
TIMEOUT = 1800.0

PAIRS = """
SELECT u.picked, b.finalized_at AS settled
  FROM awa.receipt_completion_batches b,
       unnest(b.job_ids, b.attempted_ats) AS u(job_id, picked)
 WHERE b.queue = 'bench'
UNION ALL
SELECT attempted_at, finalized_at
  FROM awa.done_entries
 WHERE queue = 'bench' AND state = 'completed'
"""

COMPLETED = """
SELECT (SELECT coalesce(sum(completed_count), 0) FROM awa.receipt_completion_batches
         WHERE queue = 'bench')
     + (SELECT count(*) FROM awa.done_entries WHERE queue = 'bench' AND state = 'completed')
"""


@dataclass
class Noop:
    """The job's arguments: the common payload (Awa names the kind after the class)."""

    amount: int
    currency: str
    note: str
    ref: str


def job(i: int) -> Noop:
    fields: dict[str, Any] = {**PAYLOAD, "ref": f"bench-{i:010d}"}
    return Noop(**fields)


async def prepare(url: str, jobs: int) -> None:
    client = awa.AsyncClient(url, max_connections=2)
    try:
        await client.migrate()
        await client.install_queue_storage()
        for start in range(0, jobs, ENQUEUE_BATCH):
            batch = [job(i) for i in range(start, min(start + ENQUEUE_BATCH, jobs))]
            await client.enqueue_many_copy(batch, queue=QUEUE)
    finally:
        await client.close()


async def wait_completed(url: str, jobs: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = await (await conn.execute(COMPLETED)).fetchone()
            if row is not None and int(row[0]) >= jobs:
                return
            await asyncio.sleep(POLL)
    raise TimeoutError(f"awa: not every job completed within {TIMEOUT:.0f}s")


async def drain(
    url: str, jobs: int, *, workers: int, claimers: int, batch: int | None, runs: Runs
) -> None:
    client = awa.AsyncClient(url, max_connections=workers + claimers + SPARE_CONNECTIONS)

    @client.task(Noop, queue=QUEUE)
    async def noop(job: Any) -> None:
        runs.ran(job.id)

    queue: dict[str, Any] = {"name": QUEUE, "max_workers": workers, "claimers": claimers}
    if batch:
        queue["claim_batch_size"] = batch
    try:
        await client.start([queue])
        try:
            await wait_completed(url, jobs)
        finally:
            await client.shutdown()
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers.awa_drain")
    runs = Runs()
    return measure(
        args,
        PAIRS,
        system=SYSTEM,
        prepare=lambda: asyncio.run(prepare(args.database_url, args.jobs)),
        drain=lambda: asyncio.run(
            drain(
                args.database_url,
                args.jobs,
                workers=args.concurrency,
                claimers=args.claimers or 1,
                batch=args.batch_size,
                runs=runs,
            )
        ),
        runs=runs,
    )


if __name__ == "__main__":
    sys.exit(main())
