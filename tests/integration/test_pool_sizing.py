"""The connection pool is sized from the threads that use it: 16 consumers and 8 workers at load.

The bridge is built as ``fencebridge run`` builds it (``open_bridge`` from a configuration file),
receives from moto's SQS over HTTP and runs a class A handler against the real PostgreSQL. The
load has duplicates and conflicting payloads in it, and halfway through every connection the
bridge holds is terminated by the server. Nothing may time out waiting for a connection, and
every operation's effect commits exactly once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bridge.config import parse_config
from bridge.identity import IdentityHasher
from bridge.runtime.process import open_bridge, pool_size
from consumers.sqs.source import SqsSettings
from tests.support.bridge_process import Job, SqsBridgeConfig, free_port
from tests.support.handlers import create_tables
from tests.support.sqs_server import SqsServer, sqs_server_process
from tests.support.waiting import eventually

HASHER = IdentityHasher(b"pool-sizing-tests-identity-secret")
TENANT = "t1"
OPERATIONS = 1000
DUPLICATES = 100
CONFLICTS = 20
CONSUMERS = 16
WORKERS = 8
#: how many messages the test keeps in the queue while the bridge drains it
QUEUE_DEPTH = 200
#: threads that take a connection from the pool, by their name's start
DATABASE_THREADS = (
    "fencebridge-handler-",
    "fencebridge-claimer",
    "fencebridge-heartbeat",
    "fencebridge-sweeper",
    "fencebridge-stats",
    "sqs-",
)


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    """moto's server in its own process (sixteen long polls on threads of this process would
    share its interpreter lock with the bridge under test), and dummy credentials for the
    clients the bridge builds itself."""
    with sqs_server_process() as server, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        yield server


def send(sqs: Any, queue_url: str, messages: list[tuple[str, object]]) -> None:
    for start in range(0, len(messages), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(body),
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": TENANT},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": "record"},
                },
            }
            for i, (op, body) in enumerate(messages[start : start + 10])
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not response.get("Failed"), response


class Feeder(threading.Thread):
    """Sends the messages in order while the bridge drains, keeping the queue about
    ``depth`` deep: moto's receive reads the whole queue for every message it returns, so a
    thousand-message queue under sixteen long polls would measure moto, not the bridge."""

    def __init__(self, sqs: Any, queue_url: str, messages: list[tuple[str, object]], depth: int):
        super().__init__(name="test-feeder", daemon=True)
        self.sqs, self.queue_url, self.messages, self.depth = sqs, queue_url, messages, depth
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.sent < len(self.messages):
                attributes = self.sqs.get_queue_attributes(
                    QueueUrl=self.queue_url,
                    AttributeNames=[
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                    ],
                )["Attributes"]
                waiting = int(attributes["ApproximateNumberOfMessages"]) + int(
                    attributes["ApproximateNumberOfMessagesNotVisible"]
                )
                if waiting >= self.depth:
                    time.sleep(0.05)
                    continue
                chunk = self.messages[self.sent : self.sent + self.depth - waiting]
                send(self.sqs, self.queue_url, chunk)
                self.sent += len(chunk)
        except Exception as e:  # noqa: BLE001 - reported by the test, never lost
            self.error = e


def conflicts(db: psycopg.Connection[Any]) -> int:
    row = db.execute(
        "SELECT count(DISTINCT operation_id) FROM rejected_delivery WHERE kind = 'conflict'"
    ).fetchone()
    return int(row[0]) if row else 0


def succeeded(db: psycopg.Connection[Any]) -> int:
    found = db.execute("SELECT count(*) FROM work_item WHERE state = 'succeeded'").fetchone()
    return int(found[0]) if found else 0


@pytest.mark.slow
def test_sixteen_consumers_and_eight_workers_never_wait_out_the_pool(
    moto: SqsServer, db_url: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("sizing", VisibilityTimeout="5")
    cfg = SqsBridgeConfig(
        queue_url=queue_url,
        endpoint_url=moto.endpoint,
        jobs={"record": Job("tests.support.handlers:RecordEffect", "A", lease_seconds=10)},
        health_port=free_port(),
        worker_threads=WORKERS,
        poll_interval_seconds=0.05,
    )
    text = cfg.toml().replace(
        'ack_mode = "after_inbox"\n', f'ack_mode = "after_inbox"\nconsumers = {CONSUMERS}\n'
    )
    config = parse_config(text, file="sizing.toml")
    assert SqsSettings.of(config.subscriptions["orders"]).consumers == CONSUMERS

    ops = [f"op-{i:04d}" for i in range(OPERATIONS)]
    conflicted = ops[:CONFLICTS]
    messages: list[tuple[str, object]] = [(op, {"n": 1}) for op in ops]
    messages += [(op, {"n": 1}) for op in ops[-DUPLICATES:]]  # replays
    messages += [(op, {"n": 2}) for op in conflicted]  # same operation, another payload
    feeder = Feeder(sqs, queue_url, messages, depth=QUEUE_DEPTH)

    # threads of earlier tests in this process (a stats exporter left running) are not the bridge's
    before = set(threading.enumerate())
    bridge = open_bridge(config, db_url, HASHER)
    cut = threading.Event()
    try:
        with caplog.at_level(logging.WARNING):
            bridge.start()
            feeder.start()
            eventually(lambda: succeeded(db) >= OPERATIONS // 2, "half the operations")
            using = [
                t.name
                for t in threading.enumerate()
                if t.name.startswith(DATABASE_THREADS) and t not in before
            ]
            # The fault: the server terminates every connection the bridge holds.
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'fencebridge'"
            )
            cut.set()
            eventually(lambda: succeeded(db) == OPERATIONS, "every operation to succeed")
            # The conflicting copies were sent last: every one recorded before the stop (a
            # stopping consumer hands back what it has not written yet).
            eventually(lambda: conflicts(db) == CONFLICTS, "every conflict to be recorded")
            stats = bridge.store.pool.get_stats()
    finally:
        bridge.stop(deadline=10)
        bridge.store.close()

    feeder.join(timeout=5)
    assert feeder.error is None, feeder.error
    assert feeder.sent == len(messages)
    assert cut.is_set()
    assert len(using) == WORKERS + CONSUMERS + 3, using
    assert bridge.store.pool.max_size == pool_size(config)
    assert bridge.store.pool.max_size >= len(using), "a connection for every thread that uses one"
    assert stats.get("requests_errors", 0) == 0, "no request for a connection timed out"
    assert "every pooled connection is busy" not in caplog.text

    effects = Counter(op for (op,) in db.execute("SELECT operation_id FROM test_effect").fetchall())
    assert effects == Counter(dict.fromkeys(ops, 1)), "every effect committed exactly once"
    rejected = db.execute(
        "SELECT DISTINCT operation_id FROM rejected_delivery WHERE kind = 'conflict'"
    ).fetchall()
    assert sorted(op for (op,) in rejected) == conflicted
