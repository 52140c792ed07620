"""The SQS consumer's broker-specific behaviour, in process, over moto's HTTP server.

The consumer, the inbox and the worker pool are the real ones, wired as the runtime wires them,
against a real PostgreSQL and moto over HTTP. In process, the test can reach the consumer's
boto3 client: answers moto never gives (a receipt handle SQS no longer honours) are injected
with botocore's ``before-send`` event as real-shaped HTTP responses, which botocore then parses
as it would parse AWS's own.

What is shown here: ``after_outcome`` keeps a delivery in flight while its row makes progress
and lets it go when the row stalls; a slow delete does not hold up the extension of another
delivery (through the SQS proxy, which gives moto real-AWS receipt-handle rules); lost broker
leases are absorbed; a failing receive is counted and retried; a FIFO group's rows are claimed
in group order, with the broker's receive count on the row.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import psycopg
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders

from bridge.config import parse_config
from bridge.handlers import Handler
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.runtime.process import build_registry
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from consumers.sqs.source import SqsConsumer
from tests.support.bridge_process import Job, SqsBridgeConfig
from tests.support.handlers import RecordEffect, SteadyProgress, create_tables
from tests.support.sqs_proxy import DELETE_BATCH, RECEIVE, Fault, sqs_proxy
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

HASHER = IdentityHasher(b"sqs-consumer-tests-identity-secret")
TENANT = "t1"
JOB = "work"


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def message(op: str, body: object, **extra: Any) -> dict[str, Any]:
    return {
        "MessageBody": json.dumps(body),
        "MessageAttributes": {
            "tenant_id": {"DataType": "String", "StringValue": TENANT},
            "operation_id": {"DataType": "String", "StringValue": op},
            "job_type": {"DataType": "String", "StringValue": JOB},
        },
        **extra,
    }


def _on_queue(sqs: Any, queue_url: str) -> list[int]:
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return [int(v) for v in attributes.values()]


def queue_empty(sqs: Any, queue_url: str) -> bool:
    """Empty on two reads in a row: moto counts visible and in-flight messages one after the
    other, so a message whose visibility ends between the two counts is in neither."""
    if any(_on_queue(sqs, queue_url)):
        return False
    time.sleep(0.05)
    return not any(_on_queue(sqs, queue_url))


def row(db_url: str, op: str) -> dict[str, Any]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT state, fence, attempts, receive_count, ordering_key FROM work_item"
            " WHERE tenant_id = %s AND operation_id = %s",
            (TENANT, op),
        )
        found = cur.fetchone()
        names = [c.name for c in cur.description or []]
    return dict(zip(names, found, strict=True)) if found else {}


def healthy(consumer: SqsConsumer) -> bool:
    """Ready, its detail the counters so far (``ok`` or ``ok (received 2, ...)``)."""
    ready, detail = consumer.status()
    return ready and (detail == "ok" or detail.startswith("ok ("))


def target(db_url: str, op: str) -> tuple[int, int] | None:
    """(last_fence, writes) of the operation's class B target record."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT last_fence, writes FROM test_target WHERE operation_id = %s", (op,)
        ).fetchone()
    return (int(found[0]), int(found[1])) if found else None


@contextmanager
def bridge(
    store: PostgresStore,
    sqs: Any,
    queue_url: str,
    handler: Handler,
    *,
    target_class: str,
    ack_mode: str,
    visibility: int,
    threads: int,
    lease_seconds: float = 1.0,
) -> Iterator[SqsConsumer]:
    """Consumer, inbox and worker pool wired as the runtime wires them; stopped afterwards."""
    settings = SqsBridgeConfig(
        queue_url=queue_url,
        endpoint_url="http://127.0.0.1:1",  # unused: the client is given
        jobs={JOB: Job("tests.support.handlers:unused", target_class, lease_seconds)},
    )
    config = parse_config(settings.toml(), file="test.toml")
    registry = build_registry(config, handlers={JOB: handler})
    pool = WorkerPool(store, registry, HASHER, threads=threads, poll_interval=0.1)
    inbox = Inbox(store.inbox, partial(decode, config.decode_rules("orders")), pool=pool)
    consumer = SqsConsumer(
        sqs,
        queue_url,
        "orders",
        inbox,
        store=store.inbox,
        ack_mode=ack_mode,
        wait_seconds=1,
        visibility_timeout=visibility,
    )
    pool.start()
    consumer.start()
    try:
        yield consumer
    finally:
        consumer.stop(10)
        pool.stop(10)


# -- after_outcome -------------------------------------------------------------------------------


@pytest.mark.promise("held-extension")
def test_visibility_is_extended_while_the_handler_progresses(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("extend", VisibilityTimeout="3")
    handler = SteadyProgress(db_url)
    # Progress for much longer than the visibility timeout (and the lease).
    sqs.send_message(QueueUrl=queue_url, **message("op-1", {"work_seconds": 8}))
    with bridge(
        store,
        sqs,
        queue_url,
        handler,
        target_class="B",
        ack_mode="after_outcome",
        visibility=3,
        threads=2,
    ) as consumer:
        eventually(
            lambda: (
                row(db_url, "op-1").get("state") == "succeeded"
                and queue_empty(sqs, queue_url)
                and consumer.held() == 0
            ),
            "the row succeeded and its delivery was deleted",
        )
    counts = dict(consumer.counts)
    assert counts["deleted"] == 1
    assert counts["received"] == 1  # never redelivered: its visibility kept being extended
    assert counts["extended"] >= 3
    assert "decision.replay" not in counts
    assert "let_go" not in counts
    assert "broker_lease_lost" not in counts
    assert handler.started == [("op-1", 1)]
    assert target(db_url, "op-1") == (1, 1)


@pytest.mark.slow
def test_a_stalled_handler_is_let_go_and_its_redelivery_replays(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("stall", VisibilityTimeout="3")
    release = threading.Event()
    handler = SteadyProgress(db_url, release)
    sqs.send_message(QueueUrl=queue_url, **message("op-1", {"stall_on_attempt": 1}))
    # One worker thread: the stalled attempt holds it, so nothing takes the row over until the
    # test has seen the consumer give up the delivery.
    with bridge(
        store,
        sqs,
        queue_url,
        handler,
        target_class="B",
        ack_mode="after_outcome",
        visibility=3,
        threads=1,
    ) as consumer:
        eventually(lambda: consumer.counts["let_go"] == 1, "the stalled delivery was let go")
        release.set()
        eventually(
            lambda: (
                row(db_url, "op-1").get("state") == "succeeded"
                and queue_empty(sqs, queue_url)
                and consumer.held() == 0
            ),
            "the takeover succeeded and the redelivery was deleted",
        )
    counts = dict(consumer.counts)
    assert counts["let_go"] == 1
    assert counts["received"] >= 2  # no more extensions after the stall: SQS redelivered it
    assert counts["decision.replay"] >= 1  # ... and the redelivery was a replay
    assert counts["decision.new"] == 1
    assert handler.started == [("op-1", 1), ("op-1", 2)]
    assert row(db_url, "op-1")["attempts"] == 2
    assert target(db_url, "op-1") == (2, 1)  # written once, by the takeover


def proxied_client(endpoint: str) -> Any:
    """A boto3 client that does not retry: each injected fault reaches the consumer."""
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


@pytest.mark.slow
def test_a_slow_delete_does_not_hold_up_another_deliverys_extension(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("slow-delete", VisibilityTimeout="3")
    handler = SteadyProgress(db_url)
    # The delete of the quick operation takes longer than the long one's whole visibility.
    with sqs_proxy(moto.endpoint, latency_seconds=5.0) as proxy:
        client = proxied_client(proxy.url)
        sqs.send_message(QueueUrl=queue_url, **message("long", {"work_seconds": 9}))
        with bridge(
            store,
            client,
            queue_url,
            handler,
            target_class="B",
            ack_mode="after_outcome",
            visibility=3,
            threads=2,
        ) as consumer:
            eventually(lambda: consumer.held() == 1, "the long operation to be held")
            proxy.inject(Fault.LATENCY, DELETE_BATCH)
            sqs.send_message(QueueUrl=queue_url, **message("quick", {"work_seconds": 0}))
            eventually(
                lambda: (
                    row(db_url, "long").get("state") == "succeeded"
                    and row(db_url, "quick").get("state") == "succeeded"
                    and queue_empty(sqs, queue_url)
                    and consumer.held() == 0
                ),
                "both succeeded and both deliveries were deleted",
            )
        counts = dict(consumer.counts)
        operations = {m: a["operation_id"] for m, a in proxy.attributes(queue_url).items()}
        receives = {operations[m]: n for m, n in proxy.receives(queue_url).items()}
        assert proxy.counts["fault.latency.DeleteMessageBatch"] == 1
        assert proxy.counts["refused.MessageNotInflight"] == 0
        assert proxy.counts["refused.ReceiptHandleIsInvalid"] == 0
    # The long delivery was extended on time while the quick one's delete hung: it was never
    # redelivered. (The quick one may have been: its delete outlasted its own visibility, and
    # its redelivery was a replay.)
    assert receives["long"] == 1
    assert counts["deleted"] == sum(receives.values())  # SQS confirms a stale handle's delete
    assert "broker_lease_lost" not in counts
    assert counts.get("decision.replay", 0) == receives["quick"] - 1
    assert sorted(handler.started) == [("long", 1), ("quick", 1)]


@pytest.mark.slow
def test_a_failing_receive_is_counted_reported_and_retried(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    create_tables(db_url)
    queue_url = moto.create_queue("receive-fails", VisibilityTimeout="3")
    with sqs_proxy(moto.endpoint) as proxy:
        proxy.inject(Fault.ERROR, RECEIVE, times=4)
        with bridge(
            store,
            proxied_client(proxy.url),
            queue_url,
            RecordEffect(),
            target_class="A",
            ack_mode="after_inbox",
            visibility=3,
            threads=1,
        ) as consumer:
            eventually(lambda: consumer.counts["receive_failed"] == 4, "four failed receives")
            moto.client().send_message(QueueUrl=queue_url, **message("op-1", {}))
            eventually(
                lambda: (
                    row(db_url, "op-1").get("state") == "succeeded"
                    and queue_empty(moto.client(), queue_url)
                ),
                "the message ingested once the receive works again",
            )
            assert healthy(consumer)
    assert consumer.counts["receive_failed"] == 4
    assert consumer.counts["deleted"] == 1


def _headers(**values: str) -> HTTPHeaders:
    headers = HTTPHeaders()
    headers["Content-Type"] = "application/x-amz-json-1.0"
    headers["x-amzn-RequestId"] = str(uuid.uuid4())
    for name, value in values.items():
        headers[name.replace("_", "-")] = value
    return headers


class _Body:
    """The raw side of an injected HTTP response, as urllib3 would hand it to botocore."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def _call_error(code: str, text: str) -> Callable[[AWSPreparedRequest], AWSResponse]:
    """A whole-call error as SQS's JSON protocol sends it (query-compatible error header)."""

    def answer(request: AWSPreparedRequest) -> AWSResponse:
        body = {"__type": f"com.amazonaws.sqs#{code}", "message": text}
        headers = _headers(x_amzn_query_error=f"{code};Sender")
        return AWSResponse(request.url, 400, headers, _Body(json.dumps(body).encode()))

    return answer


def _entry_failures(code: str, text: str) -> Callable[[AWSPreparedRequest], AWSResponse]:
    """A 200 whose every entry failed, as ChangeMessageVisibilityBatch reports it."""

    def answer(request: AWSPreparedRequest) -> AWSResponse:
        assert isinstance(request.body, bytes | str)
        entries = json.loads(request.body)["Entries"]
        body = {
            "Successful": [],
            "Failed": [
                {"Id": e["Id"], "SenderFault": True, "Code": code, "Message": text} for e in entries
            ],
        }
        return AWSResponse(request.url, 200, _headers(), _Body(json.dumps(body).encode()))

    return answer


LEASE_LOST_ANSWERS = {
    "call-ReceiptHandleIsInvalid": _call_error(
        "ReceiptHandleIsInvalid",
        'The input receipt handle "AQEB..." is not a valid receipt handle.',
    ),
    "call-InvalidParameterValue": _call_error(
        "InvalidParameterValue",
        "Value AQEB... for parameter ReceiptHandle is invalid. Reason: Message does not exist "
        "or is not available for visibility timeout change.",
    ),
    "entry-ReceiptHandleIsInvalid": _entry_failures(
        "ReceiptHandleIsInvalid", "The input receipt handle is invalid."
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("answer", list(LEASE_LOST_ANSWERS))
def test_a_lost_broker_lease_drops_the_handle_and_the_operation_completes_once(
    moto: SqsServer, store: PostgresStore, db_url: str, answer: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("lost", VisibilityTimeout="3")
    refusals: list[str] = []

    def refuse_first_extension(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        if refusals:
            return None  # later calls reach the server
        refusals.append(answer)
        return LEASE_LOST_ANSWERS[answer](request)

    sqs.meta.events.register("before-send.sqs.ChangeMessageVisibilityBatch", refuse_first_extension)
    handler = SteadyProgress(db_url)
    sqs.send_message(QueueUrl=queue_url, **message("op-1", {"work_seconds": 5}))
    with bridge(
        store,
        sqs,
        queue_url,
        handler,
        target_class="B",
        ack_mode="after_outcome",
        visibility=3,
        threads=2,
    ) as consumer:
        eventually(lambda: consumer.counts["broker_lease_lost"] == 1, "the lost lease is counted")
        assert healthy(consumer)  # nothing crashed
        eventually(
            lambda: (
                row(db_url, "op-1").get("state") == "succeeded"
                and queue_empty(sqs, queue_url)
                and consumer.held() == 0
            ),
            "the row succeeded and the redelivery was deleted",
        )
        assert healthy(consumer)
    counts = dict(consumer.counts)
    assert refusals == [answer]
    assert counts["broker_lease_lost"] == 1
    assert counts["received"] >= 2  # the dropped handle's message came back ...
    assert counts["decision.replay"] >= 1  # ... as a replay
    assert counts["decision.new"] == 1
    # Exactly once: one claim, never taken over (the handler kept its lease), one write.
    assert handler.started == [("op-1", 1)]
    assert row(db_url, "op-1")["fence"] == 1
    assert target(db_url, "op-1") == (1, 1)


# -- FIFO ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fifo_group_is_claimed_in_group_order_with_its_receive_count(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    queue_url = sqs.create_queue(
        QueueName=f"fifo-{uuid.uuid4().hex[:12]}.fifo",
        Attributes={"FifoQueue": "true", "VisibilityTimeout": "30"},
    )["QueueUrl"]
    ops = [f"op-{i}" for i in range(6)]
    # Earlier messages take longer: were the group not claimed in order, four worker threads
    # would let later ones record their effect first.
    entries = [
        {
            "Id": str(i),
            **message(
                op,
                {"sleep_seconds": 0.1 * (len(ops) - 1 - i)},
                MessageGroupId="group-1",
                MessageDeduplicationId=op,
            ),
        }
        for i, op in enumerate(ops)
    ]
    assert not sqs.send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed")

    # Someone received the group once and gave it back: the bridge's receive is the second.
    first = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    handles = [m["ReceiptHandle"] for m in first["Messages"]]
    assert len(handles) == len(ops)
    sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
            for i, h in enumerate(handles)
        ],
    )

    with bridge(
        store,
        sqs,
        queue_url,
        RecordEffect(),
        target_class="A",
        ack_mode="after_inbox",
        visibility=30,
        threads=4,
    ):
        eventually(
            lambda: (
                all(row(db_url, op).get("state") == "succeeded" for op in ops)
                and queue_empty(sqs, queue_url)
            ),
            "the whole group succeeded and was deleted",
        )
    with psycopg.connect(db_url, autocommit=True) as conn:
        seen = [op for (op,) in conn.execute("SELECT operation_id FROM test_effect ORDER BY seq")]
    assert seen == ops
    for op in ops:
        assert row(db_url, op)["ordering_key"] == "group-1"
        assert row(db_url, op)["receive_count"] == 2
