"""Erasure keeps dedupe, end to end: ``fencebridge run`` between moto's SQS (over HTTP) and
PostgreSQL, ``fencebridge erase`` as its own process beside it, and the erased tenant's messages
sent to the queue again, as a broker still holding them would hand them over.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_sqs_bridge import (
    RECORD,
    RECORD_JOB,
    TENANT,
    all_succeeded,
    effects,
    queue_empty,
    send,
    work_rows,
)
from tests.support.bridge_process import (
    BridgeProcess,
    SqsBridgeConfig,
    bridge_env,
    free_port,
    scrape,
)
from tests.support.handlers import create_tables
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def decisions(port: int) -> dict[str, float]:
    return {
        d: scrape(port, "fencebridge_deliveries_total", decision=d, subscription="orders")
        for d in ("new", "replay", "conflict")
    }


@pytest.mark.slow
def test_an_erased_tenants_redelivered_message_is_a_replay_with_no_effect(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    sqs = moto.client()
    create_tables(db_url)
    queue_url = moto.create_queue("erasure", VisibilityTimeout="5")
    cfg = SqsBridgeConfig(
        queue_url=queue_url, endpoint_url=moto.endpoint, jobs={RECORD: RECORD_JOB}
    )
    operations = [f"order-{i}" for i in range(5)]
    metrics = free_port()
    env = bridge_env(db_url, extra={"FENCEBRIDGE_PROMETHEUS_PORT": str(metrics)})

    with BridgeProcess.start(cfg, tmp_path, env) as bridge:
        send(sqs, queue_url, operations, job_type=RECORD, body={"amount": 5})
        eventually(
            lambda: all_succeeded(db_url, operations) and queue_empty(sqs, queue_url),
            "every operation succeeded and the queue is empty",
        )
        assert effects(db_url) == Counter(operations)

        erased = subprocess.run(
            [sys.executable, "-m", "bridge", "erase", "--tenant", TENANT, "--reason", "DSR-42",
             "--actor", "dpo"],
            env=env, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert erased.returncode == 0, erased.stderr
        assert "5 work row(s)" in erased.stdout
        assert "5 tombstone(s) kept" in erased.stdout
        assert work_rows(db_url) == {}
        before = decisions(metrics)

        # the broker hands one of them over again, unchanged, and one with another payload
        send(sqs, queue_url, ["order-2"], job_type=RECORD, body={"amount": 5})
        send(sqs, queue_url, ["order-3"], job_type=RECORD, body={"amount": 500})
        eventually(
            lambda: (
                decisions(metrics)["replay"] + decisions(metrics)["conflict"]
                >= before["replay"] + before["conflict"] + 2
                and queue_empty(sqs, queue_url)
            ),
            "both redeliveries were decided and deleted",
        )
        after = decisions(metrics)
        assert bridge.terminate() == 0, bridge.logs()

    assert after["new"] == before["new"]
    assert after["replay"] == before["replay"] + 1
    assert after["conflict"] == before["conflict"] + 1
    # no new work row, and the handler never ran again: each effect is still the first one
    assert work_rows(db_url) == {}
    assert effects(db_url) == Counter(operations)
    with psycopg.connect(db_url, autocommit=True) as conn:
        recorded: list[tuple[Any, ...]] = conn.execute(
            "SELECT kind, tenant_id, operation_id FROM rejected_delivery"
        ).fetchall()
        tombstones = conn.execute("SELECT count(*) FROM erased_operation").fetchone()
    assert recorded == [("conflict", None, None)]  # recorded by hashes, not identifiers
    assert tombstones == (5,)
