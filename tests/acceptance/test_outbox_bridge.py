"""The outbox end to end: ``fencebridge run`` processes, moto's SQS over HTTP, real signals.

A class A handler records an effect and publishes an announcement through the outbox; another
subscription of a fencebridge bridge takes the announcements in, by their message id. A bridge
SIGKILLed after its commits and before its relay could publish leaves the messages to the next
relay, which publishes each once; a bridge paused (SIGSTOP) inside its transaction after
publishing never lets that message out: the takeover's message goes instead.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env, free_port
from tests.support.handlers import ANNOUNCEMENTS, create_tables
from tests.support.sqs_proxy import SqsProxy, sqs_proxy
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

TENANT = "t1"
ORDER = "order"
ANNOUNCED = "announced"
DEADLINE = 120.0
ORDER_JOB = Job("tests.support.handlers:RecordAndPublish", "A", lease_seconds=3.0)
ANNOUNCED_JOB = Job("tests.support.handlers:RecordEffect", "A", lease_seconds=3.0)


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture
def proxy(moto: SqsServer) -> Iterator[SqsProxy]:
    with sqs_proxy(moto.endpoint) as p:
        yield p


def bridge_toml(
    orders_url: str,
    announcements_url: str,
    *,
    sqs_endpoint: str,
    outbox_endpoint: str,
    worker_id: str,
    consume_announcements: bool,
) -> tuple[str, int]:
    """The bridge: orders in, announcements out through the outbox (and, if asked, in again)."""
    jobs = {ORDER: ORDER_JOB, ANNOUNCED: ANNOUNCED_JOB}
    base = SqsBridgeConfig(
        queue_url=orders_url,
        endpoint_url=sqs_endpoint,
        jobs=jobs,
        worker_id=worker_id,
        subscription="orders",
    )
    text = base.toml().replace('job_types = ["order", "announced"]', 'job_types = ["order"]')
    text += f"""
[outbox.{ANNOUNCEMENTS}]
sink = "sqs"
address = "{announcements_url}"
region = "us-east-1"
endpoint_url = "{outbox_endpoint}"
lease_seconds = 2.0
poll_interval_seconds = 0.1
send_tries = 2
retry_initial_seconds = 0.05
retry_max_seconds = 0.2
"""
    if consume_announcements:
        text += f"""
[subscriptions.announcements]
source = "sqs"
queue_url = "{announcements_url}"
region = "us-east-1"
endpoint_url = "{sqs_endpoint}"
wait_seconds = 1
visibility_timeout_seconds = 5
job_types = ["{ANNOUNCED}"]

[subscriptions.announcements.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:fencebridge-message-id"
job_type = "attribute:job_type"
payload = "body"
"""
    return text, base.health_port


def start(directory: Path, name: str, toml: str, port: int, env: dict[str, str]) -> BridgeProcess:
    path = directory / f"{name}.toml"
    path.write_text(toml, encoding="utf-8")
    return BridgeProcess(path, env, health_port=port)


def send_orders(sqs: Any, queue_url: str, operations: Sequence[str], body: object) -> None:
    text = json.dumps(body)
    for start_at in range(0, len(operations), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": text,
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": TENANT},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": ORDER},
                },
            }
            for i, op in enumerate(operations[start_at : start_at + 10])
        ]
        assert not sqs.send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed")


def query(url: str, text: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(text, params).fetchall()  # type: ignore[arg-type]


def effects(url: str, job_type: str) -> Counter[str]:
    """Committed class A effects of one job type's operations."""
    rows = query(
        url,
        "SELECT e.operation_id FROM test_effect e JOIN work_item w"
        "  ON w.tenant_id = e.tenant_id AND w.operation_id = e.operation_id"
        " WHERE w.job_type = %s",
        job_type,
    )
    return Counter(op for (op,) in rows)


def states(url: str, job_type: str) -> Counter[str]:
    rows = query(url, "SELECT state FROM work_item WHERE job_type = %s", job_type)
    return Counter(s for (s,) in rows)


@pytest.mark.slow
def test_a_bridge_killed_between_commit_and_publish_leaves_each_message_to_be_sent_once(
    tmp_path: Path, moto: SqsServer, proxy: SqsProxy, db_url: str
) -> None:
    sqs = moto.client()
    create_tables(db_url)
    orders = moto.create_queue("orders")
    announcements = moto.create_queue("announcements")
    operations = [f"op-{i}" for i in range(20)]
    env = bridge_env(db_url)

    # The first bridge commits every order with its message, but its relay cannot reach SQS
    # (nothing listens where it sends): the messages stay committed and unsent.
    toml, port = bridge_toml(
        orders,
        announcements,
        sqs_endpoint=moto.endpoint,
        outbox_endpoint=f"http://127.0.0.1:{free_port()}",
        worker_id="first",
        consume_announcements=False,
    )
    with start(tmp_path, "first", toml, port, env) as first:
        first.wait_for("/healthz", 200)
        send_orders(sqs, orders, operations, {})
        eventually(
            lambda: states(db_url, ORDER) == Counter({"succeeded": len(operations)}),
            "every order committed",
            timeout=DEADLINE,
        )
        pending = query(db_url, "SELECT state, count(*) FROM outbox_message GROUP BY state")
        assert pending == [("pending", len(operations))]
        first.wait_log("outbox:announcements failed")  # its relay tried, and could not send
        first.kill()  # SIGKILL: nothing runs after it

    assert (
        int(
            sqs.get_queue_attributes(
                QueueUrl=announcements, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
        )
        == 0
    ), "nothing was published before the kill"

    # The second bridge's relay takes the destination over once the first one's lease has run
    # out, publishes through the proxy (which counts every call), and its announcements
    # subscription takes them in.
    toml, port = bridge_toml(
        orders,
        announcements,
        sqs_endpoint=moto.endpoint,
        outbox_endpoint=proxy.url,
        worker_id="second",
        consume_announcements=True,
    )
    with start(tmp_path, "second", toml, port, env) as second:
        second.wait_ready()
        eventually(
            lambda: states(db_url, ANNOUNCED) == Counter({"succeeded": len(operations)}),
            "every announcement taken in",
            timeout=DEADLINE,
        )
        assert second.terminate() == 0

    sent = query(db_url, "SELECT state, relay_fence, count(*) FROM outbox_message GROUP BY 1, 2")
    assert sent == [("sent", 2, len(operations))], "sent once, by the relay that took over"
    # every message left in exactly one SendMessageBatch entry: two calls of ten that moto
    # answered, and no other call of the relay reached it
    assert len(proxy.timings["SendMessageBatch"]) == 2
    assert set(proxy.timings) == {"SendMessageBatch"}
    # the consumer saw one operation per message, with one effect each, and no conflict
    announced = effects(db_url, ANNOUNCED)
    assert len(announced) == len(operations)
    assert set(announced.values()) == {1}
    assert query(db_url, "SELECT count(*) FROM rejected_delivery") == [(0,)]
    assert set(effects(db_url, ORDER).values()) == {1}


@pytest.mark.slow
def test_a_paused_stale_worker_never_lets_its_message_out(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    sqs = moto.client()
    create_tables(db_url)
    orders = moto.create_queue("orders")
    announcements = moto.create_queue("announcements")
    env = bridge_env(db_url)

    def config(name: str) -> tuple[str, int]:
        return bridge_toml(
            orders,
            announcements,
            sqs_endpoint=moto.endpoint,
            outbox_endpoint=moto.endpoint,
            worker_id=name,
            consume_announcements=False,
        )

    toml, port = config("paused")
    with start(tmp_path, "paused", toml, port, env) as paused:
        paused.wait_ready()
        send_orders(sqs, orders, ["op-1"], {"pause_on_attempt": 1})
        # its first attempt has written its effect and its message, and has not committed
        paused.wait_log("published fence=1")
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            toml, port = config("current")
            with start(tmp_path, "current", toml, port, env) as current:
                current.wait_ready()
                # the paused transaction is ended by the server, the lease runs out, and the
                # current bridge runs the operation again under fence 2 and publishes
                eventually(
                    lambda: states(db_url, ORDER) == Counter({"succeeded": 1}),
                    "the takeover committed",
                    timeout=DEADLINE,
                )
                eventually(
                    lambda: query(db_url, "SELECT state FROM outbox_message") == [("sent",)],
                    "the takeover's message sent",
                    timeout=DEADLINE,
                )
                os.kill(paused.pid, signal.SIGCONT)  # the stale worker wakes up
                assert current.terminate() == 0
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        paused.kill()

    rows = query(db_url, "SELECT fence, state FROM outbox_message")
    assert rows == [(2, "sent")], "only the takeover's message was ever committed"
    received = sqs.receive_message(
        QueueUrl=announcements, MaxNumberOfMessages=10, WaitTimeSeconds=1
    ).get("Messages", [])
    assert [json.loads(m["Body"]) for m in received] == [{"operation": "op-1", "fence": 2}]
    assert effects(db_url, ORDER) == Counter({"op-1": 1})
