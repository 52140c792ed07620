"""Shadow mode end to end, against moto (SNS fan-out to two SQS queues, over HTTP) and the Pub/Sub
emulator (two subscriptions on one topic, over gRPC).

An "existing consumer" reads one copy of the stream and applies every message it receives,
duplicates and a changed payload included, and loses one; it writes its effect log as JSON
Lines. ``fencebridge run`` reads the other copy with ``mode = "shadow"``. Then ``fencebridge
shadow report`` must name exactly the operations the existing system applied twice, applied
with another payload and never applied, count what the inbox would have caught, and no handler
may have run (no effect row, no work row).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest

from bridge.identity import IdentityHasher
from tests.support.bridge_process import (
    IDENTITY_KEY,
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
)
from tests.support.handlers import create_tables
from tests.support.pubsub_bridge import PubSubBridgeConfig
from tests.support.pubsub_emulator import (
    EMULATOR_HOST_ENV,
    PubSubEmulator,
    pubsub_emulator,
    require_launcher,
)
from tests.support.sqs_server import REGION, SqsServer, sqs_server
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow]

RECORD = "record"
RECORD_JOB = Job("tests.support.handlers:RecordEffect", "A", lease_seconds=3.0)
HASHER = IdentityHasher(IDENTITY_KEY.encode())
FIRST, CHANGED = b'{"amount": 5}', b'{"amount": 500}'


@dataclass(frozen=True, slots=True)
class Message:
    body: bytes
    attributes: dict[str, str]


def stream() -> list[Message]:
    """Twelve operations over two tenants (colliding ids), two published twice, one published
    again with another payload, and one message no rule can decode (no operation id)."""

    def msg(tenant: str, op: str, body: bytes = FIRST) -> Message:
        return Message(body, {"tenant_id": tenant, "operation_id": op, "job_type": RECORD})

    found = [msg(t, f"op-{i}") for t in ("t1", "t2") for i in range(6)]
    found += [msg("t1", "op-1"), msg("t2", "op-2"), msg("t1", "op-3", CHANGED)]
    found.append(Message(FIRST, {"tenant_id": "t1", "job_type": RECORD}))
    return found


#: the message the existing consumer loses
LOST = ("t2", "op-4")


def existing_consumer(received: list[Message], log: Path) -> None:
    """The mechanism being replaced: applies every message it gets, with no dedupe at all."""
    with log.open("w", encoding="utf-8") as out:
        for n, m in enumerate(received):
            tenant, op = m.attributes.get("tenant_id"), m.attributes.get("operation_id")
            if tenant is None or op is None or (tenant, op) == LOST:
                continue
            entry = {
                "tenant": tenant,
                "operation": op,
                "applied_at": f"2026-12-02T10:00:{n:02d}Z",
                "payload_hash": hashlib.sha256(m.body).hexdigest(),
            }
            out.write(json.dumps(entry) + "\n")


def shadow_toml(live_toml: str, source: str) -> str:
    return live_toml.replace(f'source = "{source}"', f'source = "{source}"\nmode = "shadow"', 1)


def recorded(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM shadow_delivery").fetchone()
    assert row is not None
    return int(row[0])


def report(config: Path, effects: Path, env: dict[str, str], *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "shadow", "report", "--config", str(config),
         "--effects", str(effects), "--json", *flags],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def check_report(config: Path, effects: Path, env: dict[str, str], db_url: str) -> None:
    raw = report(config, effects, env, "--reveal")
    job = raw["job_types"][RECORD]
    assert (job["operations"], job["replays"], job["conflicts"]) == (12, 2, 1)
    assert sum(j["deliveries"] for j in raw["job_types"].values()) == 16
    assert sum(j["undecodable"] for j in raw["job_types"].values()) == 1
    assert job["applied_more_than_once"] == [
        {"tenant": "t1", "operation": "op-1", "times": 2},
        {"tenant": "t1", "operation": "op-3", "times": 2},
        {"tenant": "t2", "operation": "op-2", "times": 2},
    ]
    assert job["applied_with_other_payload"] == [{"tenant": "t1", "operation": "op-3"}]
    assert job["never_applied"] == [{"tenant": "t2", "operation": "op-4"}]
    assert raw["effects_not_seen"] == 0

    hashed = report(config, effects, env)
    assert hashed["job_types"][RECORD]["never_applied"] == [
        {"tenant": HASHER.tenant("t2"), "operation": HASHER.operation("t2", "op-4")}
    ]
    assert "op-4" not in json.dumps(hashed)

    # no handler ran: no effect, no work row; the shadow record holds hashes, not payloads
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in ("test_effect", "work_item", "payload"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


# -- SQS: an SNS topic fanned out to two queues ------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.mark.slow
def test_shadow_on_an_sns_fan_out_names_what_the_existing_sqs_consumer_did(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    sqs = moto.client()
    sns = boto3.client("sns", endpoint_url=moto.endpoint, region_name=REGION,
                       aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    topic = sns.create_topic(Name=f"orders-{tmp_path.name[-8:]}")["TopicArn"]
    queues = []
    for name in ("existing", "shadow"):
        url = moto.create_queue(name, VisibilityTimeout="5")
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["QueueArn"],
                      Attributes={"RawMessageDelivery": "true"})  # fmt: skip
        queues.append(url)
    existing_queue, shadow_queue = queues
    create_tables(db_url)
    for m in stream():
        sns.publish(
            TopicArn=topic,
            Message=m.body.decode(),
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v} for k, v in m.attributes.items()
            },
        )

    received: list[Message] = []
    while len(received) < len(stream()):
        for m in sqs.receive_message(QueueUrl=existing_queue, MaxNumberOfMessages=10,
                                     MessageAttributeNames=["All"], WaitTimeSeconds=1,
                                     ).get("Messages", []):  # fmt: skip
            attributes = {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}
            received.append(Message(m["Body"].encode(), attributes))
            sqs.delete_message(QueueUrl=existing_queue, ReceiptHandle=m["ReceiptHandle"])
    effects = tmp_path / "effects.jsonl"
    existing_consumer(received, effects)

    cfg = SqsBridgeConfig(queue_url=shadow_queue, endpoint_url=moto.endpoint,
                          jobs={RECORD: RECORD_JOB}, subscription="orders_shadow")  # fmt: skip
    config = tmp_path / "shadow.toml"
    config.write_text(shadow_toml(cfg.toml(), "sqs"), encoding="utf-8")
    env = bridge_env(db_url)
    with BridgeProcess(config, env, health_port=cfg.health_port) as bridge:
        bridge.wait_ready()
        eventually(lambda: recorded(db_url) == 16, "every shadow delivery was recorded")
        assert bridge.terminate() == 0, bridge.logs()
        assert "subscription orders_shadow is a shadow: recorded for comparison, never run" in (
            bridge.logs()
        )
    attributes = sqs.get_queue_attributes(
        QueueUrl=shadow_queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attributes == {"ApproximateNumberOfMessages": "0",
                          "ApproximateNumberOfMessagesNotVisible": "0"}  # fmt: skip

    check_report(config, effects, env, db_url)


# -- Pub/Sub: two subscriptions on one topic ---------------------------------------------------


@pytest.fixture(scope="module")
def emulator() -> Iterator[PubSubEmulator]:
    with pubsub_emulator(require_launcher()) as running:
        yield running


def pull_all(emulator: PubSubEmulator, path: str, count: int) -> list[Message]:
    sub = emulator.subscriber()
    got: list[Message] = []
    while len(got) < count:
        response = sub.pull(request={"subscription": path, "max_messages": 100}, timeout=10)
        if response.received_messages:
            sub.acknowledge(
                request={
                    "subscription": path,
                    "ack_ids": [r.ack_id for r in response.received_messages],
                }
            )
        got += [
            Message(bytes(r.message.data), dict(r.message.attributes))
            for r in response.received_messages
        ]
    return got


@pytest.mark.slow
def test_shadow_on_a_second_pubsub_subscription_names_what_the_existing_consumer_did(
    tmp_path: Path, emulator: PubSubEmulator, db_url: str
) -> None:
    emulator.start()
    topic, existing = emulator.create()
    shadow = existing + "-shadow"
    emulator.subscriber().create_subscription(
        request={"name": shadow, "topic": topic, "ack_deadline_seconds": 10}
    )
    create_tables(db_url)
    for m in stream():
        emulator.publish(topic, m.body, **m.attributes)
    effects = tmp_path / "effects.jsonl"
    existing_consumer(pull_all(emulator, existing, len(stream())), effects)

    cfg = PubSubBridgeConfig(subscription_path=shadow, jobs={RECORD: RECORD_JOB},
                             subscription="orders_shadow")  # fmt: skip
    config = tmp_path / "shadow.toml"
    config.write_text(shadow_toml(cfg.toml(), "pubsub"), encoding="utf-8")
    env = bridge_env(db_url, extra={EMULATOR_HOST_ENV: emulator.host})
    with BridgeProcess(config, env, health_port=cfg.health_port) as bridge:
        bridge.wait_ready()
        eventually(lambda: recorded(db_url) == 16, "every shadow delivery was recorded")
        assert bridge.terminate() == 0, bridge.logs()
    assert emulator.deliverable(shadow) == []  # every copy was acknowledged

    check_report(config, effects, env, db_url)
