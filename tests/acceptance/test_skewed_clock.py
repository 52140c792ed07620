"""A bridge host's clock off by ten minutes, either way, changes nothing: leases, claims, the
sweeper and every time the bridge writes are the database's clock.

Two ``fencebridge run`` processes under libfaketime (Debian's ``faketime``), one ten minutes
ahead and one ten minutes behind, consume one SQS queue (moto): 1,000 operations, class A (an
effect row committed with the settlement) and class D (a call logged once per call), 100 sent
twice and 10 again with another payload. Had either bridge judged a lease by its own clock, the
one ahead would see every claim of the other as expired and take it over while it runs, and the
one behind would leave a dead bridge's claims alone for ten minutes. The one behind is killed
mid-run: its claims are taken over (class A) or parked ``unknown`` by the sweeper (class D with
its intent) once their leases run out on the database's clock, and everything drains. Before the
kill no claim was taken over; every class A effect is made once, every class D call at most
once; every time on a work row lies within the database's clock of the run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.calls import create_calls_table
from tests.support.handlers import create_tables
from tests.support.sqs_server import SqsServer, queue_empty, send_operations, sqs_server
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone]

JOBS = {
    "ledger": Job("tests.support.handlers:RecordEffect", "A", lease_seconds=3.0),
    "notify": Job("tests.support.calls:RecordCall", "D", lease_seconds=3.0, max_attempts=1),
}
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
PAYLOAD = {"sleep_seconds": 0.01, "answer_seconds": 0.01}
#: effects made before the bridge behind is killed
BEFORE_KILL = 300
DEADLINE = 240.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def query(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement.encode()).fetchall()


def job_of(op: str) -> str:
    return "ledger" if int(op.rsplit("-", 1)[1]) % 2 else "notify"


def send(sqs: Any, queue_url: str, operations: Sequence[str], body: object) -> None:
    """One message per operation, in batches of ten."""
    send_operations(sqs, queue_url, operations, body, job_type=job_of)


def start(
    tmp_path: Path, moto: SqsServer, queue_url: str, db_url: str, *, name: str, skew: str
) -> BridgeProcess:
    faketime = shutil.which("faketime")
    assert faketime is not None, "install Debian's faketime (libfaketime)"
    config = SqsBridgeConfig(
        queue_url=queue_url,
        endpoint_url=moto.endpoint,
        jobs=JOBS,
        worker_id=name,
        worker_threads=4,
        sweep_interval_seconds=0.5,
    )
    path = config.write(tmp_path, f"{name}.toml")
    return BridgeProcess(
        path, bridge_env(db_url), health_port=config.health_port, prefix=(faketime, "-f", skew)
    )


def test_bridges_ten_minutes_ahead_and_behind_change_nothing(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    create_tables(db_url)
    create_calls_table(db_url)
    ((began,),) = query(db_url, "SELECT now()")
    sqs = moto.client()
    queue_url = moto.create_queue(VisibilityTimeout="5")
    ops = [f"op-{i}" for i in range(OPERATIONS)]
    ahead = start(tmp_path, moto, queue_url, db_url, name="ahead", skew="+600s")
    behind = start(tmp_path, moto, queue_url, db_url, name="behind", skew="-600s")
    try:
        ahead.wait_ready()
        behind.wait_ready()
        send(sqs, queue_url, ops, PAYLOAD)
        send(sqs, queue_url, ops[:DUPLICATES], PAYLOAD)
        send(sqs, queue_url, ops[-CONFLICTS:], {"changed": True})
        eventually(
            lambda: query(db_url, "SELECT count(*) FROM test_effect")[0][0] >= BEFORE_KILL,
            "both bridges at work",
        )
        ((takeovers_before,),) = query(db_url, "SELECT count(*) FROM work_item WHERE fence > 1")
        behind.kill()
        try:
            eventually(lambda: drained(db_url, sqs, queue_url), "everything settled", DEADLINE)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {progress(db_url, sqs, queue_url)}") from None
    finally:
        ahead.close()
        behind.close()
    ((ended,),) = query(db_url, "SELECT now()")
    assert takeovers_before == 0, "no live claim was taken over"
    states = dict(query(db_url, "SELECT state, count(*) FROM work_item GROUP BY state"))
    assert sum(states.values()) == OPERATIONS
    effects = dict(query(db_url, "SELECT operation_id, count(*) FROM test_effect GROUP BY 1"))
    calls = dict(query(db_url, "SELECT operation_id, count(*) FROM test_call GROUP BY 1"))
    assert set(effects.values()) == {1}
    assert len(effects) == OPERATIONS // 2
    assert set(calls.values()) <= {1}
    unknown = {op for (op,) in query(db_url, "SELECT operation_id FROM work_item"
                                     " WHERE state = 'unknown'")}  # fmt: skip
    assert unknown <= {op for op in ops if job_of(op) == "notify"}
    assert states.get("succeeded", 0) + len(unknown) == OPERATIONS
    ((outside,),) = query(
        db_url,
        "SELECT count(*) FROM work_item WHERE NOT ("
        f" created_at BETWEEN '{began.isoformat()}' AND '{ended.isoformat()}'"
        f" AND claimed_at BETWEEN '{began.isoformat()}' AND '{ended.isoformat()}'"
        f" AND settled_at BETWEEN '{began.isoformat()}' AND '{ended.isoformat()}')",
    )
    assert outside == 0, "every time on a work row is the database's"


def progress(url: str, sqs: Any, queue_url: str) -> str:
    """Where a run that did not settle stands: its rows by state, the queue's counts."""
    states = dict(query(url, "SELECT state, count(*) FROM work_item GROUP BY state"))
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return f"rows by state {states}, queue {attributes}"


def drained(url: str, sqs: Any, queue_url: str) -> bool:
    ((rows, open_rows),) = query(
        url,
        "SELECT count(*), count(*) FILTER (WHERE state IN ('queued', 'claimed')) FROM work_item",
    )
    if (rows, open_rows) != (OPERATIONS, 0):
        return False
    return queue_empty(sqs, queue_url)
