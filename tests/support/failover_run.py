"""A run of operations through two bridges while their database fails over, and its count.

Shared by the failover tests (``tests/acceptance/test_failover.py`` fails the database over
itself, ``test_patroni_failover.py`` lets Patroni do it): the job types (class A: an effect row
in the bridge's database; class B: a fenced write of a target that logs every claim's fence;
class D: a call logged once per call), rounds of operations sent to SQS with duplicates and a
conflicting payload, two ``fencebridge run`` processes on a multi-host URL, the wait until
everything is drained, and :func:`measure`'s count of what was lost or made twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import psycopg

from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.sqs_server import SqsServer, queue_empty, send_operations

JOBS = {
    "ledger": Job("tests.support.handlers:RecordEffect", "A", lease_seconds=3.0),
    "stamp": Job("tests.support.failover_targets:LogFence", "B", lease_seconds=3.0),
    "notify": Job("tests.support.failover_targets:LogCall", "D", lease_seconds=3.0, max_attempts=1),
}
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
FAILOVERS = 10
PAYLOAD = {"sleep_seconds": 0.01, "work_seconds": 0.01}


class Servers(Protocol):
    """The bridges' database servers (a replicated pair, a Patroni cluster): a URL naming them
    all, connecting to whichever one takes writes."""

    def url(self, dbname: str = "postgres", **params: str) -> str: ...


def query(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(statement.encode()).fetchall()


def send(sqs: Any, queue_url: str, operations: Sequence[str], body: object) -> None:
    """One message per operation, in batches of ten."""
    send_operations(sqs, queue_url, operations, body, job_type=job_of)


def send_round(sqs: Any, queue_url: str, batch: Sequence[str], payload: object = PAYLOAD) -> None:
    """A round's operations, a tenth of them twice, the last one again with another payload."""
    send(sqs, queue_url, batch, payload)
    send(sqs, queue_url, batch[: DUPLICATES // FAILOVERS], payload)
    send(sqs, queue_url, batch[-1:], {"changed": True})


def job_of(op: str) -> str:
    return list(JOBS)[int(op.rsplit("-", 1)[1]) % len(JOBS)]


def start_bridges(
    tmp_path: Path, moto: SqsServer, queue_url: str, pair: Servers, target_url: str, *, wait: bool
) -> list[BridgeProcess]:
    bridges = []
    for n in range(2):
        config = SqsBridgeConfig(
            queue_url=queue_url,
            endpoint_url=moto.endpoint,
            jobs=JOBS,
            worker_id=f"bridge-{n}",
            worker_threads=4,
            sweep_interval_seconds=1.0,
        )
        text = config.toml()
        if wait:
            text = text.replace(
                'ack_mode = "after_inbox"\n',
                'ack_mode = "after_inbox"\nwait_for_standby = true\nwait_for_standby_seconds = 3\n',
            )
        path = tmp_path / f"bridge-{n}.toml"
        path.write_text(text)
        env = bridge_env(pair.url("fb", connect_timeout="3"), target_url=target_url)
        bridges.append(BridgeProcess(path, env, health_port=config.health_port))
    for bridge in bridges:
        bridge.wait_ready()
    return bridges


def drained(url: str, sqs: Any, queue_url: str) -> bool:
    try:
        ((open_rows,),) = query(
            url, "SELECT count(*) FROM work_item WHERE state IN ('queued', 'claimed')"
        )
    except psycopg.OperationalError:
        return False
    if open_rows:
        return False
    return queue_empty(sqs, queue_url)


def measure(url: str, target_url: str, ops: Sequence[str]) -> dict[str, int]:
    rows = {op for (op,) in query(url, "SELECT operation_id FROM work_item")}
    states = dict(query(url, "SELECT state, count(*) FROM work_item GROUP BY state"))
    effects = query(
        url,
        "SELECT count(*) FROM (SELECT operation_id FROM test_effect GROUP BY 1"
        " HAVING count(*) > 1) d",
    )[0][0]
    calls = query(
        target_url,
        "SELECT count(*) FROM (SELECT operation_id FROM fo_call GROUP BY 1 HAVING count(*) > 1) d",
    )[0][0]
    reuse = query(
        target_url,
        "SELECT count(*) FROM (SELECT operation_id, fence FROM fo_attempt GROUP BY 1, 2"
        " HAVING count(*) > 1 UNION ALL SELECT operation_id, fence FROM fo_call GROUP BY 1, 2"
        " HAVING count(*) > 1) d",
    )[0][0]
    lost = [op for op in ops if op not in rows]
    called = {op for (op,) in query(target_url, "SELECT operation_id FROM fo_call")}
    return {
        "operations": len(ops),
        "lost": len(lost),
        "lost_after_a_call": len(called.intersection(lost)),
        "duplicate_effects": int(effects),
        "calls_twice": int(calls),
        "fence_reuse": int(reuse),
        "unknown": int(states.get("unknown", 0)),
        "succeeded": int(states.get("succeeded", 0)),
    }
