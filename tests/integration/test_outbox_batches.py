"""The ``sqs`` and ``sns`` sinks batch by bytes as well as by count, and no message wedges a
destination: against moto's server over HTTP.

A backlog of 1,000 operations reaches two queues through a proxy that fails, throttles or cuts
one call in five. Among them are runs of six 180 KiB messages (each taken by the queue; six in
one call are more than a call may carry) and four 220 KiB ones, which the outbox takes and the
queues (``MaximumMessageSize`` 200 KiB) never will, each followed by a small message of its
ordering key. Every other message arrives, once by id; the four are parked with the queue's
reason after their attempts, and the messages of their keys behind them go out after them.
An SNS topic gets the same large messages in calls of at most 256 KiB.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import boto3
import psycopg
import pytest

from bridge.config import read_destination
from bridge.database import Connection
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.types import Key
from consumers.sns import sink as sns_sink
from tests.support.deliveries import for_job
from tests.support.outbox import destination, drain, sqs_sink
from tests.support.sqs_proxy import Fault, sqs_proxy
from tests.support.sqs_server import REGION, SqsServer, sqs_server
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]
JOB = "announce"
KIB = 1024
#: the queues' MaximumMessageSize
QUEUE_LIMIT = 200 * KIB
#: taken by a queue, but six of them are more than one call carries (moto's limit is 1 MiB)
BIG = 180 * KIB
#: under the outbox's 256 KiB, over the queues' limit: never sent
TOO_BIG = 220 * KIB
#: two queues, since moto's SQS slows down with every message a queue holds; operations
#: 0-499 publish to the first, 500-999 to the second, so a run of large ones shares a queue
QUEUES = ["announce-a", "announce-b"]
OPERATIONS = 1000
MAX_ATTEMPTS = 3


def padding(number: int) -> int:
    """The body's padding of operation ``number``: six in a row of every hundred are large,
    one in 250 too large."""
    if number % 250 == 77:
        return TOO_BIG
    return BIG if 10 <= number % 100 < 16 else 0


class Announce(SameDatabaseHandler):
    """One announcement under the operation's key (a too large one is followed by another)."""

    def handle(self, ctx: Context, tx: Connection) -> None:
        number = int(ctx.operation_id.rpartition("-")[2])
        queue = QUEUES[number * len(QUEUES) // OPERATIONS]
        body = {"operation": ctx.operation_id, "fence": ctx.fence, "pad": "x" * padding(number)}
        ctx.outbox.publish(queue, json.dumps(body), ordering_key=ctx.operation_id)
        if padding(number) == TOO_BIG:
            after = {"operation": ctx.operation_id, "after": True}
            ctx.outbox.publish(queue, json.dumps(after), ordering_key=ctx.operation_id)


@pytest.fixture
def sqs() -> Any:
    with sqs_server() as server:
        yield server


def run_all(store: PostgresStore, registry: Registry, operations: list[str]) -> None:
    hasher = IdentityHasher(b"outbox-batches-identity-secret")
    for op in operations:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", op)], timedelta(seconds=30))
        execute(
            Run(
                store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter()
            )
        )


@pytest.mark.slow
def test_large_and_unsendable_messages_never_wedge_a_backlog_of_1000_operations(
    store: PostgresStore, db: Db, sqs: SqsServer
) -> None:
    registry = Registry()
    registry.register(JOB, Announce(), outbox_destinations=frozenset(QUEUES))
    operations = [f"op-{i:04d}" for i in range(OPERATIONS)]
    store.inbox.ingest([for_job(registry, JOB, op) for op in operations])
    # delivered again: replays, never a second run or message; with another payload: conflicts
    replays = store.inbox.ingest([for_job(registry, JOB, op) for op in operations[:40]])
    assert {r.decision.value for r in replays} == {"replay"}
    conflicts = store.inbox.ingest(
        [for_job(registry, JOB, op, {"x": 1}) for op in operations[40:60]]
    )
    assert {r.decision.value for r in conflicts} == {"conflict"}
    run_all(store, registry, operations)
    written = {str(r[0]) for r in db.execute("SELECT message_id FROM outbox_message")}
    assert len(written) == OPERATIONS + 4
    queues = {name: sqs.create_queue(name, MaximumMessageSize=str(QUEUE_LIMIT)) for name in QUEUES}

    with sqs_proxy(sqs.endpoint, seed=11) as proxy:
        proxy.set_faults(
            0.2,
            kinds=(Fault.ERROR, Fault.THROTTLE, Fault.RESET),
            actions=frozenset({"SendMessageBatch"}),
        )
        relays = [
            DestinationRelay(
                name,
                destination(url, name=name, max_attempts=MAX_ATTEMPTS),
                store.outbox,
                sqs_sink(proxy.url, url),
                owner="relay-1",
            )
            for name, url in queues.items()
        ]
        for relay in relays:
            relay.service.start()
        try:
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
            for relay in relays:
                relay.service.stop(10)
        assert proxy.faults() > 0, "the fault was injected"
        assert proxy.counts["proxy_error"] == 0

    rows = db.execute(
        "SELECT message_id, state, attempts, park_reason, octet_length(body) FROM outbox_message"
    ).fetchall()
    parked = {str(r[0]): (int(r[2]), str(r[3]), int(r[4])) for r in rows if r[1] == "parked"}
    sent = {str(r[0]) for r in rows if r[1] == "sent"}
    # the four the queues never take: parked with the queue's reason once their attempts ran out
    assert len(parked) == 4
    for attempts, reason, length in parked.values():
        assert length > TOO_BIG
        assert attempts == MAX_ATTEMPTS
        assert reason.startswith(f"gave up after {MAX_ATTEMPTS} attempts: ")
        assert reason.endswith("InvalidParameterValue")
    # everything else sent, and no other message was counted for their refusals
    assert sent == written - set(parked)
    assert {int(r[2]) for r in rows if r[1] == "sent"} == {0}

    received: list[dict[str, Any]] = []
    for url in queues.values():
        received.extend(drain(sqs, url, len(sent) // len(queues)))
    ids = Counter(m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in received)
    assert set(ids) == sent, "every message sent arrived, and nothing else"
    bodies = [json.loads(m["Body"]) for m in received]
    large = {b["operation"] for b in bodies if len(b.get("pad", "")) == BIG}
    assert len(large) == 60, "every large message arrived whole"
    after = {b["operation"] for b in bodies if b.get("after")}
    assert after == {op for op in operations if padding(int(op[3:])) == TOO_BIG}, (
        "the message behind each parked one, of its key, went out"
    )
    announced = {b["operation"] for b in bodies if not b.get("after")}
    assert announced == set(operations) - after


@pytest.mark.slow
def test_an_sns_topic_gets_large_messages_in_calls_of_at_most_256_kib(
    store: PostgresStore, db: Db, sqs: SqsServer
) -> None:
    registry = Registry()
    registry.register(JOB, Announce(), outbox_destinations=frozenset(QUEUES))
    # operations 0-29: six large ones among them (10-15), all to the first destination
    operations = [f"op-{i:04d}" for i in range(30)]
    store.inbox.ingest([for_job(registry, JOB, op) for op in operations])
    run_all(store, registry, operations)
    sns = boto3.client(
        "sns",
        endpoint_url=sqs.endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    topic = sns.create_topic(Name=f"outbox-{uuid.uuid4().hex[:8]}")["TopicArn"]
    queue_url = sqs.create_queue("sns-copy")
    queue_arn = sqs.client().get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    sns.subscribe(
        TopicArn=topic,
        Protocol="sqs",
        Endpoint=queue_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    config = read_destination(
        QUEUES[0],
        {"sink": "sns", "address": topic, "region": REGION, "endpoint_url": sqs.endpoint},
    )
    calls: list[int] = []

    def measure(params: dict[str, Any], **_: Any) -> None:
        """What SNS counts of each call: the bodies and the attributes (names, types, values)."""
        calls.append(
            sum(
                len(e["Message"].encode())
                + sum(
                    len(name.encode()) + len(a["DataType"]) + len(a["StringValue"].encode())
                    for name, a in e["MessageAttributes"].items()
                )
                for e in params["PublishBatchRequestEntries"]
            )
        )

    # the calls are observed on their way to moto (which does not count a call's bytes)
    sns.meta.events.register("provide-client-params.sns.PublishBatch", measure)
    sink = sns_sink.SnsSink(sns, topic)
    relay = DestinationRelay(QUEUES[0], config, store.outbox, sink, owner="relay-1")
    while db.execute("SELECT count(*) FROM outbox_message WHERE state = 'pending'").fetchone() != (
        0,
    ):
        relay.round()
        assert len(calls) < 100, "the relay stopped making progress"
    assert calls, "the relay called SNS"
    assert max(calls) <= 256 * KIB, calls
    received = drain(sqs, queue_url, len(operations))
    assert sorted(json.loads(m["Body"])["operation"] for m in received) == operations
