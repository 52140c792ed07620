"""Erasure across an identity key rotation, end to end: ``fencebridge run`` started with the
first key between moto's SQS (over HTTP) and PostgreSQL, then ``fencebridge identity rotate``,
``fencebridge erase`` run with the new key and the old one, and with the new key alone, each as
its own process, and the erased tenants' messages sent to the queue again (duplicates, changed
payloads), as a broker still holding them would hand them over.

The bridge started before the rotation finds the tombstones hashed under its key too; once an
erasure left none under it, its inbox refuses to write (``/readyz`` says why), nothing is
deleted from the queue, and a bridge started with the new key takes the messages. No erased
operation's effect ever happens again.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.identity import IDENTITY_PREVIOUS_KEYS_ENV
from tests.acceptance.test_sqs_bridge import RECORD, RECORD_JOB, on_queue, queue_empty
from tests.support.bridge_process import (
    IDENTITY_KEY,
    BridgeProcess,
    SqsBridgeConfig,
    bridge_env,
    free_port,
)
from tests.support.bridge_process import (
    fencebridge as command,
)
from tests.support.handlers import create_tables
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

NEW_KEY = "rotated-identity-key-0123456789abcdef"
OPERATIONS = [f"order-{i}" for i in range(250)]
TENANTS = ["erased-1", "erased-2", "kept-1", "kept-2"]


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def send(sqs: Any, queue_url: str, messages: Sequence[tuple[str, str, object]]) -> None:
    """One message per (tenant, operation, body), in batches of ten."""
    for start in range(0, len(messages), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(body),
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": tenant},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": RECORD},
                },
            }
            for i, (tenant, op, body) in enumerate(messages[start : start + 10])
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not response.get("Failed"), response


def redelivery(tenant: str, changed: int) -> list[tuple[str, str, object]]:
    """Every operation of the tenant twice, the second copy of the first ``changed`` with
    another payload."""
    return [
        (tenant, op, {"amount": 500 if copy and i < changed else 5})
        for i, op in enumerate(OPERATIONS)
        for copy in (0, 1)
    ]


def query(url: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(text).fetchall()  # type: ignore[call-overload, no-any-return]


def effects(url: str) -> Counter[tuple[str, str]]:
    return Counter(query(url, "SELECT tenant_id, operation_id FROM test_effect"))


def fencebridge(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = command(env, *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_erased_tenants_redelivered_across_a_rotation_never_run_again(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    sqs = moto.client()
    create_tables(db_url)
    queue_url = moto.create_queue("erasure-rotation", VisibilityTimeout="5")
    config = SqsBridgeConfig(
        queue_url=queue_url, endpoint_url=moto.endpoint, jobs={RECORD: RECORD_JOB}
    )
    old_env = bridge_env(db_url)
    both_env = bridge_env(
        db_url, identity_key=NEW_KEY, extra={IDENTITY_PREVIOUS_KEYS_ENV: IDENTITY_KEY}
    )
    new_only_env = bridge_env(db_url, identity_key=NEW_KEY)
    first = [(t, op, {"amount": 5}) for t in TENANTS for op in OPERATIONS]

    with BridgeProcess.start(config, tmp_path, old_env) as old:
        send(sqs, queue_url, first)
        eventually(
            lambda: len(effects(db_url)) == 1000 and queue_empty(sqs, queue_url),
            "1,000 operations ran once and the queue is empty",
            timeout=300,
        )
        assert set(effects(db_url).values()) == {1}

        fencebridge(both_env, "identity", "rotate", "--reason", "CHG-38")
        erased = fencebridge(both_env, "erase", "--tenant", "erased-1", "--reason", "DSR-1")
        assert "250 tombstone(s) kept" in erased.stdout
        assert "under every identity key held: key 1, key 2" in erased.stdout

        # The bridge on the old key finds them under its key: replays and conflicts, acked.
        send(sqs, queue_url, redelivery("erased-1", changed=25))
        send(sqs, queue_url, [("kept-1", op, {"amount": 5}) for op in OPERATIONS[:50]])
        eventually(lambda: queue_empty(sqs, queue_url), "the redeliveries were acknowledged")
        old.wait_ready()
        assert set(effects(db_url).values()) == {1}, "an erased operation ran again"
        assert query(db_url, "SELECT count(*) FROM work_item WHERE tenant_id = 'erased-1'") == [
            (0,)
        ]

        erased = fencebridge(new_only_env, "erase", "--tenant", "erased-2", "--reason", "DSR-2")
        assert "no tombstone under key 1" in erased.stdout
        status = fencebridge(new_only_env, "identity", "status").stdout
        assert "key 1: erasures since" in status

        # Now it could not recognise them: it writes nothing, and says to restart it.
        send(sqs, queue_url, redelivery("erased-2", changed=25))
        unready = old.wait_for("/readyz", 503)
        assert "IdentityKeysOutdated" in json.dumps(unready), unready
        assert "FENCEBRIDGE_IDENTITY_KEY set to key 2" in old.logs()
        # At least the 500 sent: a send the client retried after a lost answer adds copies.
        # moto counts visible and in-flight messages one after the other, by the clock: a
        # batch whose visibility ends between the two counts is in neither, so one read can
        # come up a batch short; a deleted message never comes back to the count.
        eventually(
            lambda: sum(on_queue(sqs, queue_url)) >= 500,
            "every redelivery still on the queue (nothing of it was deleted)",
            timeout=20,
        )

        second = dataclasses.replace(config, health_port=free_port(), worker_id="restarted")
        with BridgeProcess.start(second, tmp_path, both_env) as new:
            new.wait_ready()
            eventually(
                lambda: queue_empty(sqs, queue_url),
                "the bridge started with the new key took every redelivery",
                timeout=300,
            )
            assert new.terminate() == 0, new.logs()
        assert old.terminate() == 0, old.logs()

    assert effects(db_url) == Counter({(t, op): 1 for t in TENANTS for op in OPERATIONS})
    assert query(db_url, "SELECT tenant_id, count(*) FROM work_item GROUP BY 1 ORDER BY 1") == [
        ("kept-1", 250),
        ("kept-2", 250),
    ]
    # the changed copies of the erased operations: conflicts recorded by hashes only
    assert query(db_url, "SELECT count(*) FROM rejected_delivery WHERE tenant_id IS NULL") == [
        (50,)
    ]
    assert query(db_url, "SELECT key_id, count(*) FROM erased_operation GROUP BY 1 ORDER BY 1") == [
        (1, 250),
        (2, 500),
    ]
