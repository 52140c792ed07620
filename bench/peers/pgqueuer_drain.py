"""PgQueuer: drain the queue with a no-op entrypoint (see :mod:`bench.peers`).

Driver asyncpg (PgQueuer's fastest). The knobs PgQueuer's users turn, all swept by
:mod:`bench.workers` to find its best configuration:

* ``--consumers``: PgQueuer instances in this process, each with its own connection (as
  PgQueuer's own examples run one per connection), running at once;
* ``--batch-size``: jobs per dequeue (PgQueuer's default is 10); its completion buffer flushes
  at that many completions or after 0.1 s;
* ``--limit``: the entrypoint's ``concurrency_limit`` (0, the default: none), at most that many
  jobs picked at once across all consumers, enforced by PgQueuer's dequeue statement (it
  switches PgQueuer to its capacity-gated dequeue);
* ``--uvloop``: uvloop's event loop instead of asyncio's own, as PgQueuer's docs suggest for
  throughput;
* ``--max-tasks``: ``max_concurrent_tasks`` of ``run`` (0, the default: none), PgQueuer's own cap
  on the jobs one consumer has picked at once, shared out evenly between the consumers (it must
  be at least twice the batch). Without it or a limit, a consumer dequeues its next batch as
  soon as it has handed the last one to tasks, so the jobs in flight are not bounded by
  consumers x batch: the drain's report gives the number measured.

Mode ``drain`` (each consumer returns once the queue is empty), LISTEN/NOTIFY on as by
default, dequeue timeout 1 s. A completed job is deleted from ``pgqueuer`` and logged in
``pgqueuer_log`` (PgQueuer's only completion mode); pick and settlement are its ``picked`` and
``successful`` log rows.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any

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


async def consume(url: str, limit: int, batch_size: int, max_tasks: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(ENTRYPOINT, concurrency_limit=limit)
        async def noop(job: Job) -> None:
            return None

        await pgq.qm.run(
            dequeue_timeout=timedelta(seconds=1),
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
            max_concurrent_tasks=max_tasks or None,
        )
    finally:
        await conn.close()


async def drain(url: str, consumers: int, limit: int, batch_size: int, max_tasks: int) -> None:
    each = max_tasks // consumers
    await asyncio.gather(*(consume(url, limit, batch_size, each) for _ in range(consumers)))


def runner(use_uvloop: bool) -> Callable[[Coroutine[Any, Any, None]], None]:
    """Runs a coroutine to its end on asyncio's event loop, or on uvloop's."""
    if not use_uvloop:
        return asyncio.run
    import uvloop  # noqa: PLC0415  (only the configurations that ask for it need it installed)

    def run(main: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
            loop.run(main)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers.pgqueuer_drain")
    batch = args.batch_size or BATCH_DEFAULT
    run = runner(args.uvloop)
    return measure(
        args,
        PAIRS,
        system=SYSTEM,
        prepare=lambda: run(prepare(args.database_url, args.jobs)),
        drain=lambda: run(
            drain(
                args.database_url, args.consumers or 1, args.limit or 0, batch, args.max_tasks or 0
            )
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
