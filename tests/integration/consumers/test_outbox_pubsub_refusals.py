"""The ``pubsub`` sink against Google's emulator: a refusal of one message never takes the
messages published with it, and a paused ordering key's batches are held, not counted.

1,000 operations publish to a topic whose schema refuses a body that is not its JSON record;
five of them publish such a body (three under shared ordering keys, two without a key). The
client publishes a key's messages (and the unkeyed ones) in batches, one request each, and the
service refuses a request as a whole for the one message it will not take; the key is then
paused and its later batches cancelled. The relay sends rounds of 300 through a proxy whose
connections are cut twice mid-run. Only the five are parked, invalid; every other message is
sent with no failed attempt counted, arrives by its id, and each key's messages arrive in the
order they were written.

A call to a topic that cannot be reached waits one deadline in all (not one per message) and is
unavailable, not counted, whatever keys its timed-out publishes had.
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
from google.pubsub_v1 import SchemaServiceClient
from google.pubsub_v1.types import Encoding, Schema

from bridge.config import read_destination
from bridge.database import Connection
from bridge.errors import SinkUnavailable
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE, OutboxMessage
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.types import Key
from consumers.pubsub import sink as pubsub_sink
from consumers.pubsub.sink import PubSubSink
from tests.support.deliveries import for_job
from tests.support.proxy import proxy_to
from tests.support.pubsub_emulator import PROJECT, PubSubEmulator, with_emulator_host
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]
JOB = "announce"
DESTINATION = "announcements"
OPERATIONS = 1000
KEYS = 8
#: the operations whose body the topic's schema refuses: 16 (the third message of key 0),
#: 403 and 777 (keys 3 and 1), 19 and 509 (no key)
REFUSED = {16, 19, 403, 509, 777}
RECORD = {
    "type": "record",
    "name": "Announcement",
    "fields": [{"name": "operation", "type": "string"}, {"name": "n", "type": "int"}],
}


def ordering_key(number: int) -> str | None:
    """One operation in ten publishes without a key; the others share eight keys."""
    return None if number % 10 == 9 else f"account-{number % KEYS}"


class Announce(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> None:
        number = int(ctx.operation_id.rpartition("-")[2])
        body = (
            f"not a record: {number}"
            if number in REFUSED
            else json.dumps({"operation": ctx.operation_id, "n": number})
        )
        ctx.outbox.publish(DESTINATION, body, ordering_key=ordering_key(number))


def schema_topic(emulator: PubSubEmulator) -> tuple[str, str]:
    """A topic whose JSON messages must be :data:`RECORD`, and an ordered subscription."""
    schemas = with_emulator_host(emulator.host, SchemaServiceClient)
    name = f"fb-{uuid.uuid4().hex[:12]}"
    schema = schemas.create_schema(
        request={
            "parent": f"projects/{PROJECT}",
            "schema": Schema(name=name, type_=Schema.Type.AVRO, definition=json.dumps(RECORD)),
            "schema_id": name,
        }
    )
    topic = emulator.publisher().topic_path(PROJECT, name)
    emulator.publisher().create_topic(
        request={
            "name": topic,
            "schema_settings": {"schema": schema.name, "encoding": Encoding.JSON},
        }
    )
    subscription = emulator.subscriber().subscription_path(PROJECT, name)
    emulator.subscriber().create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": True}
    )
    return topic, subscription


def pull_all(emulator: PubSubEmulator, subscription: str) -> list[Any]:
    """Every message of the subscription, in the order it hands them out, each acknowledged
    once pulled: an ordered subscription hands out a key's later messages once the earlier
    ones are acknowledged."""
    subscriber = emulator.subscriber()
    found: list[Any] = []
    while True:
        # the emulator answers at once when it has messages; with none, it holds the pull
        # until shortly before the call's deadline and answers empty: nothing is left
        response = subscriber.pull(
            request={"subscription": subscription, "max_messages": 1000}, timeout=3, retry=None
        )
        if not response.received_messages:
            return found
        found.extend(r.message for r in response.received_messages)
        subscriber.acknowledge(
            request={
                "subscription": subscription,
                "ack_ids": [r.ack_id for r in response.received_messages],
            }
        )


@pytest.mark.slow
def test_a_refused_message_never_takes_its_batch_and_a_paused_keys_batches_are_held(
    emulator: PubSubEmulator, store: PostgresStore, db: Db
) -> None:
    topic, subscription = schema_topic(emulator)
    registry = Registry()
    registry.register(JOB, Announce(), outbox_destinations=frozenset({DESTINATION}))
    hasher = IdentityHasher(b"outbox-pubsub-identity-secret")
    operations = [f"op-{i:04d}" for i in range(OPERATIONS)]
    store.inbox.ingest([for_job(registry, JOB, op) for op in operations])
    # delivered again: replays, never a second run or message; with another payload: conflicts
    replays = store.inbox.ingest([for_job(registry, JOB, op) for op in operations[:40]])
    assert {r.decision.value for r in replays} == {"replay"}
    conflicts = store.inbox.ingest(
        [for_job(registry, JOB, op, {"x": 1}) for op in operations[40:60]]
    )
    assert {r.decision.value for r in conflicts} == {"conflict"}
    for op in operations:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", op)], timedelta(seconds=30))
        execute(
            Run(
                store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter()
            )
        )
    written = [
        (str(r[0]), r[1], r[2])
        for r in db.execute("SELECT message_id, ordering_key, seq FROM outbox_message ORDER BY seq")
    ]
    assert len(written) == OPERATIONS

    def sent() -> int:
        row = db.execute("SELECT count(*) FROM outbox_message WHERE state = 'sent'").fetchone()
        return int(row[0]) if row is not None else 0

    host, _, port = emulator.host.rpartition(":")
    with proxy_to(host, int(port)) as proxy:
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        # batches of ten: a key's first batch is sent while its later ones wait behind it,
        # so the refusal of the first cancels them
        batches = pubsub_v1.types.BatchSettings(max_messages=10)
        publisher = with_emulator_host(
            f"127.0.0.1:{proxy.port}",
            lambda: pubsub_v1.PublisherClient(batch_settings=batches, publisher_options=options),
        )
        config = read_destination(
            DESTINATION,
            {
                "sink": "pubsub",
                "address": topic,
                "batch": 300,
                "poll_interval_seconds": 0.05,
                "max_attempts": 3,
                "retry_initial_seconds": 0.05,
            },
        )
        relay = DestinationRelay(
            DESTINATION, config, store.outbox, PubSubSink(publisher, topic), owner="r"
        )
        relay.service.start()
        try:
            # the fault: every connection to the emulator cut, twice, while messages go out
            for progress in (100, 500):
                eventually(lambda n=progress: sent() >= n, f"{progress} messages sent")
                proxy.stop()
                proxy.start()
            eventually(
                lambda: (
                    db.execute(
                        "SELECT count(*) FROM outbox_message WHERE state = 'pending'"
                    ).fetchone()
                    == (0,)
                ),
                "no message left pending",
                timeout=240,
            )
        finally:
            relay.service.stop(10)

    rows = db.execute(
        "SELECT operation_id, state, attempts, park_reason FROM outbox_message ORDER BY seq"
    ).fetchall()
    parked = {int(str(r[0])[3:]): (r[2], r[3]) for r in rows if r[1] == "parked"}
    assert set(parked) == REFUSED, "only the messages the topic refuses are parked"
    assert set(parked.values()) == {(1, "InvalidArgument")}
    # the others were sent, and none was counted: not the refused ones' batch mates, not the
    # batches of a paused key cancelled before they were sent
    assert {(r[1], r[2]) for r in rows if r[1] != "parked"} == {("sent", 0)}

    received = pull_all(emulator, subscription)
    ids = [m.attributes[MESSAGE_ID_ATTRIBUTE] for m in received]
    expected = {m for m, _, _ in written} - {
        m for (m, _, _), r in zip(written, rows, strict=True) if r[1] == "parked"
    }
    assert set(ids) == expected, "every message sent arrived, by its id, and nothing else"
    # a cut connection may have made a copy: the same id, never another message
    assert len({(m.attributes[MESSAGE_ID_ATTRIBUTE], m.data) for m in received}) == len(set(ids))
    arrived: dict[str, list[str]] = defaultdict(list)
    for message in received:
        if (
            message.ordering_key
            and message.attributes[MESSAGE_ID_ATTRIBUTE] not in arrived[message.ordering_key]
        ):
            arrived[message.ordering_key].append(message.attributes[MESSAGE_ID_ATTRIBUTE])
    in_order: dict[str, list[str]] = defaultdict(list)
    for message_id, key, _ in written:
        if key and message_id in expected:
            in_order[key].append(message_id)
    assert dict(arrived) == dict(in_order), "each key's messages arrived in the order written"


class Watched:
    """The client, with the timeout each wait on one of its futures was given written down."""

    def __init__(self, publisher: Any) -> None:
        self._publisher = publisher
        self.waits: list[float] = []

    def publish(self, topic: str, data: bytes, **kwargs: Any) -> Any:
        return WatchedFuture(self._publisher.publish(topic, data, **kwargs), self.waits)

    def resume_publish(self, topic: str, key: str) -> None:
        self._publisher.resume_publish(topic, key)


class WatchedFuture:
    def __init__(self, future: Any, waits: list[float]) -> None:
        self._future = future
        self._waits = waits

    def result(self, timeout: float | None = None) -> Any:
        self._waits.append(timeout if timeout is not None else float("inf"))
        return self._future.result(timeout=timeout)


@pytest.mark.slow
def test_a_call_to_an_unreachable_topic_waits_one_deadline_and_is_unavailable(
    emulator: PubSubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, subscription = emulator.create(enable_message_ordering=True)
    monkeypatch.setattr(pubsub_sink, "PUBLISH_TIMEOUT_SECONDS", 1.0)
    messages = [
        OutboxMessage(f"fb1_unreachable.{n}", "t1", "op-1", b"hello", ordering_key=key)
        for n, key in enumerate(["k1", "k2", None, "k1"], start=1)
    ]
    host, _, port = emulator.host.rpartition(":")
    with proxy_to(host, int(port)) as proxy:
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        client = with_emulator_host(
            f"127.0.0.1:{proxy.port}", lambda: pubsub_v1.PublisherClient(publisher_options=options)
        )
        watched = Watched(client)
        sink = PubSubSink(watched, topic)
        proxy.stop()  # the emulator cannot be reached: every publish waits
        # nothing went through: unavailable (not counted), within one deadline for the call,
        # and the keys whose publishes timed out (not paused) need no resuming
        with pytest.raises(SinkUnavailable, match="TimeoutError"):
            sink.send(messages)
        assert len(watched.waits) == len(messages)
        assert sum(watched.waits) <= 1.0

        proxy.start()

        def delivered() -> bool:
            try:
                return sink.send(messages) == {}
            except SinkUnavailable:
                return False

        eventually(delivered, "the messages published once the emulator is back")
        client.stop()
    ids = {m.attributes[MESSAGE_ID_ATTRIBUTE] for m in pull_all(emulator, subscription)}
    assert ids == {m.message_id for m in messages}
