"""Procrastinate: drain the queue with a no-op async task (see :mod:`bench.peers`).

Driver psycopg (Procrastinate's own ``PsycopgConnector``), its connection pool sized to the
concurrency plus two (the listener and the worker's own bookkeeping), opened full. The
concurrency is the worker's ``concurrency`` (async jobs in parallel). Procrastinate fetches one
job per statement (``procrastinate_fetch_job_v2``), by design. ``wait=False`` makes the worker
return once no job is left; LISTEN/NOTIFY on and the fetch polling interval at its default, as
shipped. Finished jobs are kept (``delete_jobs="never"``, the default), as fencebridge keeps its
settled rows; pick and settlement are the ``started`` and ``succeeded`` rows that
Procrastinate's triggers write into ``procrastinate_events``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from procrastinate import App, PsycopgConnector

from bench.peers import ENQUEUE_BATCH, PAYLOAD, measure, parse

SYSTEM = "procrastinate"
QUEUE = "bench"

PAIRS = """
SELECT p.at AS picked, s.at AS settled
  FROM procrastinate_events p
  JOIN procrastinate_events s ON s.job_id = p.job_id AND s.type = 'succeeded'
 WHERE p.type = 'started'
"""


def app_for(url: str, pool_size: int) -> App:
    app = App(connector=PsycopgConnector(conninfo=url, min_size=pool_size, max_size=pool_size))

    @app.task(name="noop", queue=QUEUE)
    async def noop(**kwargs: Any) -> None:
        return None

    return app


async def prepare(url: str, jobs: int) -> None:
    app = app_for(url, 2)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        for start in range(0, jobs, ENQUEUE_BATCH):
            batch: list[dict[str, Any]] = [PAYLOAD] * min(ENQUEUE_BATCH, jobs - start)
            await task.batch_defer_async(*batch)


async def drain(url: str, concurrency: int) -> None:
    app = app_for(url, concurrency + 2)
    async with app.open_async():
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency,
            wait=False,
            delete_jobs="never",
            install_signal_handlers=False,
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers.procrastinate_drain")
    return measure(
        args,
        PAIRS,
        system=SYSTEM,
        prepare=lambda: asyncio.run(prepare(args.database_url, args.jobs)),
        drain=lambda: asyncio.run(drain(args.database_url, args.concurrency)),
    )


if __name__ == "__main__":
    sys.exit(main())
