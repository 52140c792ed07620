"""What only Pub/Sub has, against Google's emulator: exactly-once acks, ack deadlines that run
out during a blocked write, the emulator dying mid-stream, and holding deliveries until their
outcome.

Ack deadlines are the service minimum (10 s) and the consumers cap the client's own lease
management at 1 s, so a delivery whose write is blocked comes back about ten seconds later.
Writes are blocked with locks the test holds in PostgreSQL, never with sleeps.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from bridge.adapters import sources
from bridge.adapters.holding import confirm
from bridge.config import parse_config
from bridge.database import SessionTimeouts
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.types import Key, State
from consumers.pubsub.source import AckCalls, PubSubConsumer, from_config, subscriber_client
from tests.integration.consumers.conformance import (
    RULES,
    SUBSCRIPTION,
    Db,
    eventually,
    inbox_for,
    order,
    rows,
)
from tests.support.pubsub_emulator import PROJECT, PubSubEmulator, with_emulator_host

#: a redelivery takes the 10 s ack deadline plus the client's lease loop; leave room for a
#: loaded machine
REDELIVERY_WAIT = 90.0
#: with exactly-once delivery the client library leases a message for at least 60 s, so a
#: message whose write hangs comes back only after that
EXACTLY_ONCE_REDELIVERY_WAIT = 180.0


class Consumers:
    """Starts consumers on the emulator and stops whatever a test left running."""

    def __init__(self, emulator: PubSubEmulator) -> None:
        self.emulator = emulator
        self._started: list[PubSubConsumer] = []

    def start(self, path: str, inbox: Inbox, **options: Any) -> PubSubConsumer:
        options = {"batch_max_wait_ms": 20, "probe_interval": 0.5, **options}
        consumer = PubSubConsumer(
            subscriber_client(self.emulator.host),
            path,
            SUBSCRIPTION,
            inbox,
            close_client=True,
            **options,
        )
        self._started.append(consumer)
        consumer.start()
        eventually(lambda: consumer.status()[0], "the consumer to be receiving")
        return consumer

    def stop_all(self) -> None:
        for consumer in self._started:
            consumer.stop(deadline=10)


@pytest.fixture
def consumers(emulator: PubSubEmulator) -> Iterator[Consumers]:
    started = Consumers(emulator)
    try:
        yield started
    finally:
        started.stop_all()


def publish(emulator: PubSubEmulator, topic: str, tenant: str, op: str, amount: int) -> str:
    message = order(tenant, op, amount)
    return emulator.publish(topic, message.body, **message.attributes)


def test_exactly_once_is_read_from_the_subscription(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore
) -> None:
    _, on = emulator.create(enable_exactly_once_delivery=True)
    _, off = emulator.create(ack_deadline=20)
    assert consumers.start(on, inbox_for(store)).exactly_once is True
    plain = consumers.start(off, inbox_for(store))
    assert plain.exactly_once is False
    assert plain.ack_deadline == 20


@pytest.mark.slow
def test_a_late_ack_fails_with_invalid_ack_id_and_the_redelivery_is_a_replay(
    emulator: PubSubEmulator, consumers: Consumers, db_url: str, db: Db
) -> None:
    topic, path = emulator.create(enable_exactly_once_delivery=True)
    # No lock timeout: the inbox transaction must wait behind the test's lock for as long as
    # it holds it (a deployment's lock_timeout would roll it back and nack instead).
    store = PostgresStore.connect(db_url, max_size=4, timeouts=SessionTimeouts(None, None, None))
    consumer = consumers.start(path, inbox_for(store), max_lease_duration=1)
    with psycopg.connect(db_url) as locker:
        # The inbox transaction waits for this lock, far past the ack deadline: the client
        # stops leasing the message after a second and it is handed out again.
        locker.execute("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
        message_id = publish(emulator, topic, "t1", "op-1", 5)
        eventually(
            lambda: consumer.counts["received"] >= 2,
            "the redelivery",
            timeout=EXACTLY_ONCE_REDELIVERY_WAIT,
        )
        assert consumer.counts["acked"] == 0
        locker.rollback()

    eventually(lambda: consumer.counts["ack_id_expired"] >= 1, "the late ack to be refused")
    eventually(lambda: consumer.counts["acked"] >= 1, "the replay to be acked")
    consumer.stop()
    counts = consumer.counts
    assert counts["decision.new"] == 1
    assert counts["decision.replay"] >= 1
    assert counts["ack_failed"] == 0  # an expired ack id is not a processing failure
    assert db.execute("SELECT broker_message_id, state FROM work_item").fetchall() == [
        (message_id, "queued")
    ]
    # The work is there once: one claim, and nothing else to claim.
    assert len(store.claims.claim("w", 10, timedelta(seconds=30))) == 1
    store.close()
    assert emulator.deliverable(path) == []


@pytest.mark.slow
def test_a_delivery_whose_write_outlives_its_ack_deadline_is_ingested_once(
    emulator: PubSubEmulator, consumers: Consumers, db_url: str, db: Db
) -> None:
    topic, path = emulator.create()
    store = PostgresStore.connect(db_url, max_size=4, timeouts=SessionTimeouts(None, None, None))
    consumer = consumers.start(path, inbox_for(store), max_lease_duration=1)
    with psycopg.connect(db_url) as locker:
        # An uncommitted row with the same key: the inbox's insert waits on its unique index.
        locker.execute(
            "INSERT INTO work_item (tenant_id, operation_id, subscription, job_type,"
            " target_class, payload_hash, payload_ref)"
            " VALUES ('t1', 'op-1', 'orders', 'refund', 'C', %s, 'pg:held-by-test')",
            (bytes(32),),
        )
        publish(emulator, topic, "t1", "op-1", 5)
        eventually(
            lambda: consumer.counts["received"] >= 2, "the redelivery", timeout=REDELIVERY_WAIT
        )
        assert consumer.counts["acked"] == 0
        locker.rollback()

    eventually(lambda: consumer.counts["acked"] >= 2, "both copies to be acked")
    consumer.stop()
    assert consumer.counts["decision.new"] == 1
    assert consumer.counts["decision.replay"] >= 1
    ((tenant, operation, ref),) = db.execute(
        "SELECT tenant_id, operation_id, payload_ref FROM work_item"
    ).fetchall()
    assert (tenant, operation) == ("t1", "op-1")
    assert ref != "pg:held-by-test"
    store.close()
    assert emulator.deliverable(path) == []


@pytest.mark.slow
def test_the_consumer_survives_an_emulator_crash_and_reports_it_meanwhile(
    emulator: PubSubEmulator,
    consumers: Consumers,
    store: PostgresStore,
    db: Db,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="consumers.pubsub.source")
    name = "fb-restart"
    topic, path = emulator.create(name)
    consumer = consumers.start(path, inbox_for(store))
    for i in range(5):
        publish(emulator, topic, "t1", f"before-{i}", i)
    eventually(lambda: rows(db) == 5, "the first messages to be stored")

    emulator.kill()
    eventually(lambda: not consumer.status()[0], "the consumer to report it is not receiving")
    ready, reason = consumer.status()
    assert not ready
    assert reason.startswith(f"{SUBSCRIPTION}: ")
    assert any("not receiving" in r.getMessage() for r in caplog.records)

    # The emulator keeps everything in memory: after a restart the topic, the subscription
    # and any unacknowledged message are gone, so the test creates them again.
    emulator.start()
    topic, path = emulator.create(name)
    eventually(lambda: consumer.status()[0], "the consumer to be receiving again", timeout=120)
    after = [publish(emulator, topic, "t1", f"after-{i}", i) for i in range(5)]
    eventually(lambda: rows(db) == 10, "the messages published after the restart", timeout=120)
    eventually(lambda: consumer.counts["acked"] >= 10, "every message to be acked")
    consumer.stop()

    stored = db.execute(
        "SELECT broker_message_id FROM work_item WHERE operation_id LIKE 'after-%'"
    ).fetchall()
    assert sorted(r[0] for r in stored) == sorted(after)
    assert emulator.deliverable(path) == []


@pytest.mark.slow
def test_a_stream_that_ends_with_an_error_is_opened_again(
    emulator: PubSubEmulator,
    consumers: Consumers,
    store: PostgresStore,
    db: Db,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="consumers.pubsub.source")
    topic, path = emulator.create()
    consumer = consumers.start(path, inbox_for(store))
    # Deleting the subscription ends the stream with NOT_FOUND: the client gives up on it.
    emulator.subscriber().delete_subscription(request={"subscription": path})
    eventually(lambda: "NOT_FOUND" in consumer.status()[1], "the consumer to report why")
    assert not consumer.status()[0]
    eventually(lambda: consumer.counts["reconnects"] >= 1, "the ended stream to be noticed")
    assert any("stream ended: NOT_FOUND" in r.getMessage() for r in caplog.records)

    emulator.subscriber().create_subscription(
        request={"name": path, "topic": topic, "ack_deadline_seconds": 10}
    )
    eventually(lambda: consumer.status()[0], "the consumer to be receiving again")
    publish(emulator, topic, "t1", "op-1", 5)
    eventually(lambda: consumer.counts["acked"] == 1, "the message to be stored and acked")
    consumer.stop()
    assert rows(db) == 1
    assert emulator.deliverable(path) == []


@pytest.mark.promise("held-extension")
@pytest.mark.slow
def test_after_outcome_extends_a_progressing_claim_and_acks_when_it_settles(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore, db: Db
) -> None:
    topic, path = emulator.create(enable_exactly_once_delivery=True)
    consumer = consumers.start(path, inbox_for(store), store=store.inbox, ack_mode="after_outcome")
    publish(emulator, topic, "t1", "op-1", 5)
    eventually(lambda: consumer.held() == 1, "the delivery to be held")
    (claim,) = store.claims.claim_keys("w", [Key("t1", "op-1")], timedelta(seconds=3))

    # The handler makes progress for longer than the ack deadline: the lease is renewed, so
    # the consumer keeps extending the delivery and the emulator never hands it out again.
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(0.5):
            store.settle.heartbeat(claim.ticket, timedelta(seconds=3))

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    try:
        eventually(
            lambda: consumer.counts["extended"] >= 4,
            "extensions across more than one ack deadline",
            timeout=REDELIVERY_WAIT,
        )
    finally:
        stop.set()
        beating.join()
    assert consumer.counts["acked"] == 0
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    eventually(lambda: consumer.counts["acked"] == 1, "the ack once the row succeeded")
    consumer.stop()
    assert consumer.counts["received"] == 1  # never redelivered
    assert consumer.counts["let_go"] == 0
    assert emulator.deliverable(path) == []


def receive_to_ack_counts(reader: InMemoryMetricReader) -> int:
    """How many acknowledgements the receive-to-ack histogram recorded for the subscription."""
    data = reader.get_metrics_data()
    found = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != n.METRIC_RECEIVE_TO_ACK:
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if attributes.get(n.LABEL_SUBSCRIPTION) == SUBSCRIPTION:
                        assert isinstance(point, HistogramDataPoint)
                        found += point.count
    return found


def test_after_outcome_records_receive_to_ack_for_held_deliveries(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore, db: Db
) -> None:
    """The holder's acks are acknowledgements too: each one is timed from its receive."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(IdentityHasher(b"receive-to-ack-test-secret-0001"), meter_provider=meters)
    inbox = Inbox(store.inbox, partial(decode, RULES), telemetry=telemetry)
    topic, path = emulator.create(enable_exactly_once_delivery=True, enable_message_ordering=True)
    consumer = consumers.start(path, inbox, store=store.inbox, ack_mode="after_outcome")
    try:
        for i in range(3):
            publish(emulator, topic, "t1", f"op-{i}", 5 + i)
        eventually(lambda: consumer.held() == 3, "the deliveries to be held")
        assert receive_to_ack_counts(reader) == 0
        for claim in store.claims.claim("w", 3, timedelta(seconds=30)):
            store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        eventually(lambda: consumer.counts["acked"] == 3, "the acks once the rows succeeded")
        eventually(lambda: receive_to_ack_counts(reader) == 3, "three receive-to-ack times")
    finally:
        consumer.stop()
        meters.shutdown()


@pytest.mark.slow
def test_after_outcome_lets_a_stalled_claim_go_and_its_redelivery_is_a_replay(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore, db: Db
) -> None:
    topic, path = emulator.create(enable_exactly_once_delivery=True)
    consumer = consumers.start(path, inbox_for(store), store=store.inbox, ack_mode="after_outcome")
    publish(emulator, topic, "t1", "op-1", 5)
    eventually(lambda: consumer.held() == 1, "the delivery to be held")
    # Claimed and never renewed: the lease lapses, the claim is stalled.
    store.claims.claim_keys("w", [Key("t1", "op-1")], timedelta(seconds=1))
    eventually(lambda: consumer.counts["let_go"] >= 1, "the stalled delivery to be let go")
    eventually(
        lambda: consumer.counts["decision.replay"] >= 1,
        "the redelivery, written as a replay",
        timeout=REDELIVERY_WAIT,
    )
    assert consumer.counts["acked"] == 0

    # Another worker takes the expired claim over and finishes: the delivery is acked.
    (takeover,) = store.claims.claim("w2", 1, timedelta(seconds=30))
    assert takeover.fence == 2
    store.settle.settle(Settlement(takeover.ticket, State.SUCCEEDED, "ok"))
    eventually(lambda: consumer.counts["acked"] >= 1, "the ack after the takeover", REDELIVERY_WAIT)
    consumer.stop()
    assert consumer.counts["decision.new"] == 1
    assert rows(db) == 1
    assert emulator.deliverable(path) == []


@dataclass(frozen=True)
class Pulled:
    """A pulled copy as the ack calls see it: its ack id."""

    handle: str


@pytest.mark.slow
def test_acks_sent_out_of_delivery_order_are_each_confirmed_once_those_before_are(
    emulator: PubSubEmulator,
) -> None:
    # With ordering, the service confirms an ack only after those of the copies delivered
    # before it (the emulator counts the unkeyed copies as one key) and the emulator refuses
    # every ack id of a call from the first one out of delivery order: a batch with two ids
    # the wrong way round was refused whole at every retry, for as long as it was retried,
    # and every batch delivered after it with it.
    topic, path = emulator.create(
        ack_deadline=600, enable_exactly_once_delivery=True, enable_message_ordering=True
    )
    emulator.publish_many(topic, [(b"%d" % i, {}) for i in range(1000)])
    pulled: list[Pulled] = []
    while len(pulled) < 1000:
        response = emulator.subscriber().pull(
            request={"subscription": path, "max_messages": 1000}, timeout=10, retry=None
        )
        pulled += [Pulled(r.ack_id) for r in response.received_messages]
    # Batches of 100 in the order delivered, each with two neighbours swapped (as callbacks
    # racing each other would queue them), answered in any order, each on a call thread of
    # its own as the consumer does.
    rnd = random.Random(11)
    batches = [pulled[i : i + 100] for i in range(0, len(pulled), 100)]
    for batch in batches:
        at = rnd.randrange(len(batch) - 1)
        batch[at], batch[at + 1] = batch[at + 1], batch[at]
    rnd.shuffle(batches)
    # The consumer's own client: its channel reads the long lists of refused ack ids.
    client = subscriber_client(emulator.host)
    calls = AckCalls(client, path)
    stopping = threading.Event()
    try:
        with ThreadPoolExecutor(len(batches)) as pool:
            answers = list(
                pool.map(
                    lambda batch: confirm(
                        calls.settle, batch, budget=120.0, stopping=stopping, name="test"
                    ),
                    batches,
                )
            )
    finally:
        client.close()
    assert [(len(lost), len(left)) for _, lost, left in answers] == [(0, 0)] * len(batches)
    done = [h.handle for confirmed, _, _ in answers for h in confirmed]
    assert sorted(done) == sorted(h.handle for h in pulled)
    assert emulator.deliverable(path) == []


def test_ordering_key_delivery_attempt_and_trace_context_reach_the_row(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore, db: Db
) -> None:
    dead_letters, _ = emulator.create()
    topic, path = emulator.create(
        enable_message_ordering=True,
        dead_letter_policy={"dead_letter_topic": dead_letters, "max_delivery_attempts": 5},
    )
    consumers.start(path, inbox_for(store))
    producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    client_side = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = json.dumps({"operation": "op-1", "amount": 1}).encode()
    emulator.publish(topic, body, ordering_key="group-1", tenant="t1", traceparent=producer)
    body = json.dumps({"operation": "op-2", "amount": 2}).encode()
    emulator.publish(topic, body, tenant="t1", googclient_traceparent=client_side)
    eventually(lambda: rows(db) == 2, "both messages to be stored")
    found = db.execute(
        "SELECT operation_id, ordering_key, receive_count, trace_context FROM work_item"
        " ORDER BY operation_id"
    ).fetchall()
    assert found == [("op-1", "group-1", 1, producer), ("op-2", None, 1, client_side)]


def test_from_config_builds_a_working_consumer(
    emulator: PubSubEmulator, store: PostgresStore, db: Db
) -> None:
    topic, path = emulator.create()
    config = parse_config(
        f"""
        [jobs.refund]
        handler = "app.refunds:handler"
        target_class = "C"

        [subscriptions.{SUBSCRIPTION}]
        source = "pubsub"
        subscription = "{path}"
        job_types = ["refund"]
        batch_max_messages = 10
        batch_max_wait_ms = 5
        flow_control = {{ max_messages = 50, max_lease_duration_seconds = 60 }}

        [subscriptions.{SUBSCRIPTION}.decode]
        tenant_id = "attribute:tenant"
        operation_id = "body:/operation"
        job_type = "value:refund"
        payload = "body:/amount"
        """
    )
    assert path.startswith(f"projects/{PROJECT}/")
    assert sources.factory("pubsub") is from_config
    sub = config.subscriptions[SUBSCRIPTION]
    consumer = with_emulator_host(emulator.host, lambda: from_config(sub, inbox_for(store), store))
    consumer.start()
    try:
        publish(emulator, topic, "t1", "op-1", 5)
        eventually(lambda: consumer.counts["acked"] == 1, "the message to be stored and acked")
    finally:
        consumer.stop()
    assert rows(db) == 1
