"""PgQueuer: drain the queue with a no-op entrypoint (see :mod:`bench.peers`).

Driver asyncpg (PgQueuer's fastest), one connection as in PgQueuer's own examples. The
concurrency is the entrypoint's ``concurrency_limit``: at most that many jobs picked at once,
enforced by PgQueuer's dequeue statement (``max_concurrent_tasks`` cannot express 1: it must be
at least twice the batch size). The batch size is PgQueuer's default of 10, or the concurrency
when lower (``--batch-size`` overrides it); its completion buffer flushes at that many
completions or after 0.1 s. Mode
``drain`` (it returns once the queue is empty), LISTEN/NOTIFY on as by default, dequeue timeout
1 s. A completed job is deleted from ``pgqueuer`` and logged in ``pgqueuer_log`` (PgQueuer's
only completion mode); pick and settlement are its ``picked`` and ``successful`` log rows.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import timedelta

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from bench.peers import ENQUEUE_BATCH, PAYLOAD, measure, parse

SYSTEM = "pgqueuer"
ENTRYPOINT = "bench"
BATCH_DEFAULT = 10

PAIRS = """
SELECT p.created AS picked, s.created AS settled
  FROM pgqueuer_log p
  JOIN pgqueuer_log s ON s.job_id = p.job_id AND s.status = 'successful'
 WHERE p.status = 'picked'
"""


async def prepare(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        body = json.dumps(PAYLOAD).encode()
        for start in range(0, jobs, ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, jobs - start)
            await queries.enqueue([ENTRYPOINT] * n, [body] * n, [0] * n)
    finally:
        await conn.close()


async def drain(url: str, concurrency: int, batch_size: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(ENTRYPOINT, concurrency_limit=concurrency)
        async def noop(job: Job) -> None:
            return None

        await pgq.qm.run(
            dequeue_timeout=timedelta(seconds=1),
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
        )
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers.pgqueuer_drain")
    batch = args.batch_size or min(BATCH_DEFAULT, args.concurrency)
    return measure(
        args,
        PAIRS,
        system=SYSTEM,
        prepare=lambda: asyncio.run(prepare(args.database_url, args.jobs)),
        drain=lambda: asyncio.run(drain(args.database_url, args.concurrency, batch)),
    )


if __name__ == "__main__":
    sys.exit(main())
