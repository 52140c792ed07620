"""Class D through ``fencebridge run`` at volume: claims that die before their call run once.

A class D target can be called at most once, so its executor records an intent under the fence
before the one call, and a row with an intent is never called again. A row with no intent made
no call. Here 1,000 class D operations (a hundred of them sent twice, ten sent again with
another payload) go through moto's SQS into a bridge with four workers and sixteen prefetched
rows; the handler checks each payload for a moment before the intent, and the target takes a
moment to answer after it acted. The bridge is SIGKILLed
mid-run, holding rows its inbox wrote claimed, rows it prefetched and rows in their check, none
of which had called, and rows whose intent was recorded. A second bridge's sweeper sends the
first kind back to the queue, and they are called once; the second kind is parked ``unknown``
and never called again. Every operation is called at most once, and every one the kill did not
catch after its intent exactly once.

The target is ``test_call`` in the bridge's database (:mod:`tests.support.calls`): one row per
call, committed by the handler itself, whatever became of the work row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.database import APPLICATION_NAME
from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.calls import create_calls_table
from tests.support.sqs_server import SqsServer, queue_empty, send_operations, sqs_server
from tests.support.waiting import eventually

NOTIFY = "notify"
NOTIFY_JOB = Job("tests.support.calls:RecordCall", "D", lease_seconds=2.0, max_attempts=1)
TENANT = "t1"
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
PREFETCH = 16
#: the check before the intent, and the answer after the call: long enough for the kill to find
#: claims in both
PAYLOAD = {"validate_seconds": 0.03, "answer_seconds": 0.03}
#: calls made before the first bridge is killed
CALLS_BEFORE_KILL = 200
DEADLINE = 180.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def send(sqs: Any, queue_url: str, operations: Sequence[str], body: object) -> None:
    """One message per operation, in batches of ten."""
    send_operations(sqs, queue_url, operations, body, job_type=lambda _op: NOTIFY, tenant=TENANT)


def start_bridge(
    tmp_path: Path,
    moto: SqsServer,
    queue_url: str,
    *,
    env: dict[str, str],
    worker: str,
    prefetch: int,
) -> BridgeProcess:
    config = SqsBridgeConfig(
        queue_url=queue_url,
        endpoint_url=moto.endpoint,
        jobs={NOTIFY: NOTIFY_JOB},
        worker_id=worker,
        worker_threads=4,
        sweep_interval_seconds=1.0,
    )
    path = tmp_path / f"{worker}.toml"
    path.write_text(config.toml().replace("[bridge]\n", f"[bridge]\nprefetch = {prefetch}\n", 1))
    return BridgeProcess(path, env, health_port=config.health_port)


def query(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall()  # type: ignore[arg-type]


def bridge_sessions(url: str) -> int:
    ((sessions,),) = query(
        url,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        APPLICATION_NAME,
    )
    return int(sessions)


def calls(url: str) -> Counter[str]:
    return Counter(op for (op,) in query(url, "SELECT operation_id FROM test_call"))


def drained(url: str, sqs: Any, queue_url: str) -> bool:
    (rows, open_rows), *_ = query(
        url,
        "SELECT count(*), count(*) FILTER (WHERE state IN ('queued', 'claimed')) FROM work_item",
    )
    if (rows, open_rows) != (OPERATIONS, 0):
        return False
    return queue_empty(sqs, queue_url)


@pytest.mark.slow
def test_class_d_claims_a_killed_bridge_held_before_their_call_are_called_once(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    create_calls_table(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("unstarted", VisibilityTimeout="5")
    ops = [f"op-{i:04d}" for i in range(OPERATIONS)]
    send(sqs, queue_url, ops, PAYLOAD)
    send(sqs, queue_url, ops[:DUPLICATES], PAYLOAD)  # replays
    send(sqs, queue_url, ops[500 : 500 + CONFLICTS], {**PAYLOAD, "to": "changed"})  # conflicts
    env = bridge_env(db_url)

    with start_bridge(
        tmp_path, moto, queue_url, env=env, worker="bridge-1", prefetch=PREFETCH
    ) as first:
        first.wait_ready()
        eventually(
            lambda: sum(calls(db_url).values()) >= CALLS_BEFORE_KILL,
            "the first bridge to make some calls",
            timeout=DEADLINE,
        )
        first.kill()
    # Its sessions end once the server notices: a commit it had sent is in, or never will be.
    eventually(lambda: bridge_sessions(db_url) == 0, "the killed bridge's sessions to end")
    held = dict(
        query(
            db_url,
            "SELECT operation_id, intent_fence FROM work_item"
            " WHERE state = 'claimed' AND lease_owner = 'bridge-1'",
        )
    )
    unstarted = {op for op, intent in held.items() if intent is None}
    calling = set(held) - unstarted
    assert len(unstarted) >= PREFETCH // 2, f"the kill found {len(unstarted)} unstarted claims"

    with start_bridge(tmp_path, moto, queue_url, env=env, worker="bridge-2", prefetch=0) as second:
        second.wait_ready()
        eventually(lambda: drained(db_url, sqs, queue_url), "everything settled", timeout=DEADLINE)
        assert second.terminate() == 0, second.logs()
        logs = second.logs()

    made = calls(db_url)
    rows = {
        op: (state, code, fence)
        for op, state, code, fence in query(
            db_url, "SELECT operation_id, state, outcome_code, fence FROM work_item"
        )
    }
    assert sorted(rows) == ops
    twice = sorted(op for op, n in made.items() if n > 1)
    assert twice == [], f"{len(twice)} operations called twice"
    # The claims that had not recorded an intent made no call: queued again, called once.
    assert {op: rows[op][0] for op in unstarted} == dict.fromkeys(unstarted, "succeeded")
    assert {op: made[op] for op in unstarted} == dict.fromkeys(unstarted, 1)
    assert all(rows[op][2] >= 2 for op in unstarted)
    assert "class D claim(s) that expired before their call back to the queue" in logs
    # Those caught after their intent may or may not have called: unknown, never called again.
    assert {op: rows[op][:2] for op in calling} == dict.fromkeys(
        calling, ("unknown", "lease_expired_attempts_exhausted")
    )
    assert all(made[op] <= 1 for op in calling)
    rest = set(ops) - set(held)
    assert {op for op in rest if rows[op][0] != "succeeded"} == set()
    assert {op for op in rest if made[op] != 1} == set()
    ((conflicts,),) = query(
        db_url, "SELECT count(*) FROM rejected_delivery WHERE kind = 'conflict'"
    )
    assert conflicts == CONFLICTS
