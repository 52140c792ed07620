"""DBOS Transact: drain a queue of no-op workflows (see :mod:`bench.peers`).

A DBOS job is a workflow on a queue, its id the delivery's key: enqueuing an id already in the
system database attaches to the workflow that has it (DBOS's default id-reuse policy), so a
redelivered key starts nothing. The system database is the drain's own fresh database on the
same server (schema ``dbos``, created by ``DBOS.migrate``): the no-op workflow has no
transaction step, so DBOS needs no application database here.

The jobs are queued from a ``DBOSClient``, the workflow id set to each job's key (what
``SetWorkflowID`` sets inside an application), a thousand per transaction
(``enqueue_in_transaction``, DBOS's nearest thing to a batch API); then every tenth key is
queued a second time, in transactions of their own after all the first ones, to show that the
duplicates dedupe (the preparation checks that the queue holds one workflow per key). The
queue's knobs, swept by :mod:`bench.workers`:

* ``--concurrency``: the queue's ``worker_concurrency`` (workflows one executor runs at once);
* ``--poll-interval``: the queue's ``polling_interval_sec`` (DBOS's default is 1 s): its queue
  thread claims at most what its concurrency leaves free, then sleeps this long, so the rate is
  bounded by concurrency over interval.

The drain launches DBOS (one executor, its queue thread and workflow threads), and returns
once the system database has every workflow in ``SUCCESS`` (polled every 20 ms). Pick and
settlement: ``started_at_epoch_ms``, stamped by the claim's ``now()``, and ``completed_at``,
stamped by the ``now()`` of the statement that records the outcome (both milliseconds). The
workflow counts its own runs, keyed by workflow id: each job once is each key's workflow run
exactly once, its duplicate enqueue included.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, DBOSClient, EnqueueOptions

from bench.peers import ENQUEUE_BATCH, PAYLOAD, Runs, measure, parse

SYSTEM = "dbos"
QUEUE = "bench"
WORKFLOW = "bench.noop"
#: every this many jobs, the job is queued twice
DUPLICATE_EVERY = 10
POLL = 0.02
TIMEOUT = 1800.0

PAIRS = """
SELECT to_timestamp(started_at_epoch_ms / 1000.0) AS picked,
       to_timestamp(completed_at / 1000.0) AS settled
  FROM dbos.workflow_status
 WHERE queue_name = 'bench' AND status = 'SUCCESS'
"""

SUCCEEDED = (
    "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = 'bench' AND status = 'SUCCESS'"
)

QUEUED = "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = 'bench'"

RUNS = Runs()


@DBOS.workflow(name=WORKFLOW)
def noop(payload: dict[str, Any]) -> None:
    """The no-op job: counts its run under its workflow id, the job's key."""
    RUNS.ran(DBOS.workflow_id)


def key(i: int) -> str:
    return f"bench-{i:010d}"


def sqlalchemy_url(url: str) -> str:
    return (
        sa.make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )


def prepare(url: str, jobs: int, concurrency: int, poll_interval: float) -> None:
    DBOS.migrate(url)
    client = DBOSClient(system_database_url=url)
    engine = sa.create_engine(sqlalchemy_url(url), pool_size=1, max_overflow=0)
    try:
        client.register_queue(
            QUEUE, worker_concurrency=concurrency, polling_interval_sec=poll_interval
        )
        keys = [key(i) for i in range(jobs)]
        keys += [key(i) for i in range(0, jobs, DUPLICATE_EVERY)]
        for start in range(0, len(keys), ENQUEUE_BATCH):
            with engine.begin() as conn:
                for workflow_id in keys[start : start + ENQUEUE_BATCH]:
                    options: EnqueueOptions = {
                        "workflow_name": WORKFLOW,
                        "queue_name": QUEUE,
                        "workflow_id": workflow_id,
                    }
                    client.enqueue_in_transaction(conn, options, PAYLOAD)
        with psycopg.connect(url) as check:
            row = check.execute(QUEUED.encode()).fetchone()
        if row is None or row[0] != jobs:  # the duplicates deduped: one workflow per key
            raise RuntimeError(f"dbos: {len(keys)} enqueues made {row} workflows, not {jobs}")
    finally:
        engine.dispose()
        client.destroy()


def wait_succeeded(url: str, jobs: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(SUCCEEDED.encode()).fetchone()
            if row is not None and int(row[0]) >= jobs:
                return
            time.sleep(POLL)
    raise TimeoutError(f"dbos: not every workflow succeeded within {TIMEOUT:.0f}s")


def drain(url: str, jobs: int, concurrency: int) -> None:
    DBOS(
        config={
            "name": "bench",
            "system_database_url": url,
            "sys_db_pool_size": concurrency + 4,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        wait_succeeded(url, jobs)
    finally:
        DBOS.destroy()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers.dbos_drain")
    return measure(
        args,
        PAIRS,
        system=SYSTEM,
        prepare=lambda: prepare(
            args.database_url, args.jobs, args.concurrency, args.poll_interval or 1.0
        ),
        drain=lambda: drain(args.database_url, args.jobs, args.concurrency),
        runs=RUNS,
    )


if __name__ == "__main__":
    sys.exit(main())
