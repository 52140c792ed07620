"""``ctx.outbox.publish`` refuses, at publish time, what its destination's broker would refuse.

A registry built from a configuration with an ``sqs`` and a ``pubsub`` destination: a class A
handler publishes messages at and past each limit of each kind (SQS and SNS: 256 KiB with the
attributes, ten attributes, attribute names, text, 128-character message groups; Pub/Sub:
10 MB, 100 attributes, keys of 256 bytes, values of 1,024 bytes, ordering keys of 1,024
bytes). What the broker would refuse raises ``OutboxError`` in the handler, naming the limit,
and the run ends with nothing recorded; what it takes is recorded, as the relay will send it.
Large messages that a destination takes are read by the relay a bounded size at a time.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.config import parse_config
from bridge.database import Connection
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry, build_registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.outbox.publish import OutboxError
from bridge.store import PostgresStore
from bridge.types import Key, State
from tests.support.deliveries import for_job

Db = psycopg.Connection[Any]
JOB = "announce"
QUEUE = "queue"
TOPIC = "topic"
CONFIG = f"""
[jobs.{JOB}]
handler = "tests.integration.test_outbox_limits:Publish"
target_class = "A"

[subscriptions.orders]
source = "sqs"
queue_url = "http://127.0.0.1:9/queue/orders"
job_types = ["{JOB}"]

[subscriptions.orders.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/id"
job_type = "attribute:type"
payload = "body:/data"

[outbox.{QUEUE}]
sink = "sqs"
address = "http://127.0.0.1:9/queue/events"

[outbox.{TOPIC}]
sink = "pubsub"
address = "projects/p/topics/events"
"""
KIB = 1024


@dataclass(frozen=True)
class Case:
    destination: str
    body: bytes | str = "x"
    attributes: Mapping[str, str] = field(default_factory=dict)
    ordering_key: str | None = None
    #: what the refusal says, or None when the broker takes the message
    refused: str | None = None


def attrs(count: int) -> dict[str, str]:
    return {f"a{n}": "v" for n in range(count)}


CASES: dict[str, Case] = {
    # Pub/Sub
    "pubsub value of 1024 bytes": Case(TOPIC, attributes={"a": "v" * 1024}),
    "pubsub value of 1025 bytes": Case(
        TOPIC, attributes={"a": "v" * 1025}, refused="a value is at most 1024 bytes (Pub/Sub)"
    ),
    "pubsub value of 1025 bytes in 513 characters": Case(
        TOPIC, attributes={"a": "é" * 512 + "v"}, refused="at most 1024 bytes"
    ),
    "pubsub key of 256 bytes": Case(TOPIC, attributes={"k" * 256: "v"}),
    "pubsub key of 257 bytes": Case(TOPIC, attributes={"k" * 257: "v"}, refused="1 to 256 bytes"),
    "pubsub 98 attributes of its own": Case(TOPIC, attributes=attrs(98)),
    "pubsub 99 attributes of its own": Case(
        TOPIC, attributes=attrs(99), refused="at most 98 attributes of its own (Pub/Sub)"
    ),
    "pubsub ordering key of 1024 bytes": Case(TOPIC, ordering_key="k" * 1024),
    "pubsub ordering key of 1025 bytes": Case(
        TOPIC, ordering_key="k" * 1025, refused="an ordering key is 1 to 1,024 bytes"
    ),
    "pubsub ordering key with a space": Case(TOPIC, ordering_key="order 1"),
    "pubsub attribute named goog...": Case(
        TOPIC, attributes={"googx": "v"}, refused="is reserved (Pub/Sub)"
    ),
    "pubsub attribute named AWS.x": Case(TOPIC, attributes={"AWS.x": "v"}),
    "pubsub bytes that are not text": Case(TOPIC, body=b"\xff\x00\x01"),
    "pubsub body of 5 MB": Case(TOPIC, body=b"x" * 5_000_000),
    "pubsub body of 10 MB": Case(
        TOPIC, body=b"x" * 10_000_000, refused="with its attributes, over the 9997952"
    ),
    # SQS (and SNS)
    "sqs body of 256 KiB alone": Case(
        QUEUE, body="x" * (256 * KIB), refused="with its attributes, over the 262144"
    ),
    "sqs body of 250 KiB": Case(QUEUE, body="x" * (250 * KIB)),
    "sqs attributes past 256 KiB with the body": Case(
        QUEUE,
        body="x" * (250 * KIB),
        attributes={"big": "v" * (6 * KIB)},
        refused="SQS and SNS takes",
    ),
    "sqs 8 attributes of its own": Case(QUEUE, attributes=attrs(8)),
    "sqs 9 attributes of its own": Case(
        QUEUE, attributes=attrs(9), refused="at most 8 attributes of its own (SQS and SNS)"
    ),
    "sqs attribute name starting with a period": Case(
        QUEUE, attributes={".a": "v"}, refused="not starting or ending with '.'"
    ),
    "sqs attribute name with two periods": Case(
        QUEUE, attributes={"a..b": "v"}, refused="without '..'"
    ),
    "sqs attribute name with a space": Case(QUEUE, attributes={"a b": "v"}, refused="letters"),
    "sqs attribute named amazon.x": Case(
        QUEUE, attributes={"amazon.x": "v"}, refused="is reserved (SQS and SNS)"
    ),
    "sqs attribute named goog...": Case(QUEUE, attributes={"googx": "v"}),
    "sqs attribute value with a control character": Case(
        QUEUE, attributes={"a": "v\x01"}, refused="the value holds a character"
    ),
    "sqs body with a control character": Case(
        QUEUE, body="line\x01", refused="the body holds a character SQS and SNS refuses"
    ),
    "sqs body that is not UTF-8": Case(
        QUEUE, body=b"\xff\xfe", refused="the body is not UTF-8 text"
    ),
    "sqs body with tab, newline and emoji": Case(QUEUE, body="a\tb\r\nc \U0001f600 \ufffd"),
    "sqs ordering key of 128 characters": Case(QUEUE, ordering_key="k" * 128),
    "sqs ordering key of 129 characters": Case(
        QUEUE, ordering_key="k" * 129, refused="1 to 128 of letters, digits and ASCII punctuation"
    ),
    "sqs ordering key with a space": Case(QUEUE, ordering_key="order 1", refused="ordering key"),
    "sqs ordering key of punctuation": Case(QUEUE, ordering_key=string.punctuation),
}


class Publish(SameDatabaseHandler):
    """Publishes the case its operation names, once; keeps what ``publish`` raised."""

    def __init__(self) -> None:
        self.raised: dict[str, OutboxError] = {}

    def handle(self, ctx: Context, tx: Connection) -> None:
        case = CASES[ctx.operation_id]
        try:
            ctx.outbox.publish(
                case.destination,
                case.body,
                attributes=case.attributes,
                ordering_key=case.ordering_key,
            )
        except OutboxError as exc:
            self.raised[ctx.operation_id] = exc
            raise


@pytest.fixture
def registry() -> Registry:
    return build_registry(parse_config(CONFIG), {JOB: Publish()})


def test_each_destination_refuses_at_publish_what_its_broker_would_refuse(
    registry: Registry, store: PostgresStore, db: Db
) -> None:
    handler = registry[JOB].handler
    assert isinstance(handler, Publish)
    hasher = IdentityHasher(b"outbox-limits-identity-secret")
    store.inbox.ingest([for_job(registry, JOB, name) for name in CASES])
    for name in CASES:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", name)], timedelta(seconds=30))
        execute(
            Run(
                store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter()
            )
        )

    rows = db.execute("SELECT operation_id, state FROM work_item").fetchall()
    states = {str(op): State(state) for op, state in rows}
    recorded = {str(r[0]) for r in db.execute("SELECT operation_id FROM outbox_message")}
    wrong: dict[str, str] = {}
    for name, case in CASES.items():
        raised = handler.raised.get(name)
        if case.refused is None:
            if raised is not None or states[name] is not State.SUCCEEDED or name not in recorded:
                wrong[name] = f"refused ({raised}), expected recorded"
        elif raised is None or case.refused not in str(raised):
            wrong[name] = f"raised {raised!r}, expected a refusal saying {case.refused!r}"
        elif states[name] is not State.FAILED_TERMINAL or name in recorded:
            wrong[name] = f"{states[name]}, recorded: {name in recorded}"
        elif not str(raised).startswith(f"outbox.{case.destination}: "):
            wrong[name] = f"the error does not name its destination: {raised}"
    assert wrong == {}


def test_a_destination_named_without_its_sink_takes_the_narrowest_limits(
    store: PostgresStore, db: Db
) -> None:
    registry = Registry()
    registry.register(JOB, Publish(), outbox_destinations=frozenset({TOPIC}))
    hasher = IdentityHasher(b"outbox-limits-identity-secret")
    name = "pubsub body of 5 MB"
    store.inbox.ingest([for_job(registry, JOB, name)])
    (claim,) = store.claims.claim_keys("worker", [Key("t1", name)], timedelta(seconds=30))
    execute(
        Run(store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter())
    )
    handler = registry[JOB].handler
    assert isinstance(handler, Publish)
    assert "over the 262144 SQS and SNS takes" in str(handler.raised[name])
    assert db.execute("SELECT count(*) FROM outbox_message").fetchone() == (0,)


class PublishLarge(SameDatabaseHandler):
    """One 4.5 MB message to the Pub/Sub destination (it takes up to 10 MB)."""

    def handle(self, ctx: Context, tx: Connection) -> None:
        ctx.outbox.publish(TOPIC, b"x" * 4_500_000)


@pytest.mark.slow
def test_a_relay_round_reads_a_bounded_size_of_bodies_and_always_one_message(
    store: PostgresStore,
) -> None:
    registry = build_registry(parse_config(CONFIG), {JOB: PublishLarge()})
    hasher = IdentityHasher(b"outbox-limits-identity-secret")
    operations = [f"large-{n}" for n in range(9)]
    store.inbox.ingest([for_job(registry, JOB, op) for op in operations])
    for op in operations:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", op)], timedelta(seconds=30))
        execute(
            Run(
                store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter()
            )
        )
    outbox = store.outbox
    # 40.5 MB pending: a round of up to 100 reads the first ones up to 32 MiB (the last one
    # read may cross it), in the order written
    read = outbox.pending(TOPIC, 100)
    assert [m.operation_id for m in read] == operations[:8]
    assert sum(len(m.body) for m in read) == 8 * 4_500_000
    # however small the bound, a round reads one message, so a large one never stalls it
    assert [m.operation_id for m in outbox.pending(TOPIC, 100, max_bytes=1)] == operations[:1]
