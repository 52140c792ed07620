"""The ``pubsub`` outbox sink against Google's emulator: ordering keys and trace context.

Twenty operations each publish five numbered messages under one ordering key, through class A
runs; the relay sends them in rounds that cut across the keys, and the subscription (with
message ordering on) hands each key's messages over in the order they were written, each with
its id and the trace context of the operation that wrote it.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from google.cloud import pubsub_v1

from bridge.config import read_destination
from bridge.database import Connection
from bridge.errors import SinkUnavailable
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE, TRACEPARENT_ATTRIBUTE
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.types import Delivery, Key, TargetClass
from consumers.pubsub.sink import PubSubSink
from tests.support.pubsub_emulator import PROJECT, PubSubEmulator, with_emulator_host

Db = psycopg.Connection[Any]
JOB = "announce"
DESTINATION = "events"
PER_OPERATION = 5
PRODUCER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class AnnounceSteps(SameDatabaseHandler):
    """Publishes five numbered messages under the operation's ordering key."""

    def handle(self, ctx: Context, tx: Connection) -> None:
        for step in range(PER_OPERATION):
            ctx.outbox.publish(
                DESTINATION,
                json.dumps({"operation": ctx.operation_id, "step": step}),
                ordering_key=ctx.operation_id,
            )


@pytest.mark.slow
def test_pubsub_sink_keeps_each_ordering_keys_messages_in_order_with_ids_and_trace(
    emulator: PubSubEmulator, store: PostgresStore, db: Db
) -> None:
    topic, subscription = emulator.create(enable_message_ordering=True)
    registry = Registry()
    registry.register(JOB, AnnounceSteps(), outbox_destinations=frozenset({DESTINATION}))
    hasher = IdentityHasher(b"outbox-pubsub-identity-secret")
    operations = [f"op-{i:02d}" for i in range(20)]
    store.inbox.ingest(
        [
            Delivery(
                tenant_id="t1",
                operation_id=op,
                subscription="s",
                job_type=JOB,
                target_class=TargetClass.A,
                payload=b"{}",
                trace_context=PRODUCER,
            )
            for op in operations
        ]
    )
    for op in operations:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", op)], timedelta(seconds=30))
        ctx = Context.for_claim(claim, hasher)
        execute(Run(store.settle, claim, registry[JOB], ctx, EventCounter()))
    written = [str(r[0]) for r in db.execute("SELECT message_id FROM outbox_message ORDER BY seq")]
    assert len(written) == len(operations) * PER_OPERATION

    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    publisher = with_emulator_host(
        emulator.host, lambda: pubsub_v1.PublisherClient(publisher_options=options)
    )
    config = read_destination(
        DESTINATION,
        {"sink": "pubsub", "address": topic, "batch": 7, "poll_interval_seconds": 0.05},
    )
    relay = DestinationRelay(
        DESTINATION, config, store.outbox, PubSubSink(publisher, topic), owner="r"
    )
    rounds = 0
    while db.execute("SELECT count(*) FROM outbox_message WHERE state = 'pending'").fetchone() != (
        0,
    ):
        relay.round()
        rounds += 1
        assert rounds < 100, "the relay stopped making progress"
    assert rounds >= len(written) // 7, "rounds of seven cut across the keys"

    received = emulator.deliverable(subscription)
    ids = [m.attributes[MESSAGE_ID_ATTRIBUTE] for m in received]
    assert sorted(ids) == sorted(written), "each message once, by its id"
    steps: dict[str, list[int]] = defaultdict(list)
    for message in received:
        body = json.loads(message.data)
        assert message.ordering_key == body["operation"]
        steps[body["operation"]].append(body["step"])
        # the run had no span of its own here: the trace continues from the operation's producer
        assert message.attributes[TRACEPARENT_ATTRIBUTE] == PRODUCER
    assert dict(steps) == {op: list(range(PER_OPERATION)) for op in operations}


@pytest.mark.slow
def test_a_topic_that_cannot_take_messages_keeps_them_pending_until_it_can(
    emulator: PubSubEmulator, store: PostgresStore, db: Db
) -> None:
    registry = Registry()
    registry.register(JOB, AnnounceSteps(), outbox_destinations=frozenset({DESTINATION}))
    hasher = IdentityHasher(b"outbox-pubsub-identity-secret")
    store.inbox.ingest(
        [
            Delivery(
                tenant_id="t1",
                operation_id="op-1",
                subscription="s",
                job_type=JOB,
                target_class=TargetClass.A,
                payload=b"{}",
            )
        ]
    )
    (claim,) = store.claims.claim_keys("worker", [Key("t1", "op-1")], timedelta(seconds=30))
    execute(
        Run(store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter())
    )

    name = f"fb-late-{uuid.uuid4().hex[:8]}"
    topic = f"projects/{PROJECT}/topics/{name}"
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    publisher = with_emulator_host(
        emulator.host, lambda: pubsub_v1.PublisherClient(publisher_options=options)
    )
    config = read_destination(
        DESTINATION,
        {"sink": "pubsub", "address": topic, "send_tries": 2, "retry_initial_seconds": 0.01},
    )
    relay = DestinationRelay(
        DESTINATION, config, store.outbox, PubSubSink(publisher, topic), owner="r"
    )
    # the topic does not exist yet: the round fails as a whole, nothing is counted or parked
    with pytest.raises(SinkUnavailable, match="NotFound"):
        relay.round()
    rows = db.execute("SELECT state, attempts FROM outbox_message").fetchall()
    assert rows == [("pending", 0)] * PER_OPERATION

    # once it exists, the key (paused by the failure) is resumed and its messages go in order
    created, subscription = emulator.create(name, enable_message_ordering=True)
    assert created == topic
    relay.round()
    assert db.execute("SELECT DISTINCT state FROM outbox_message").fetchall() == [("sent",)]
    steps = [json.loads(m.data)["step"] for m in emulator.deliverable(subscription)]
    assert steps == list(range(PER_OPERATION))
