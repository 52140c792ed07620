"""The SQS proxy against moto's server: real-AWS receipt-handle rules, and the faults it injects.

Each rule is first shown to be one moto lacks (the same calls straight to moto), then the proxy
is shown to enforce it. Faults are observed the way a client observes them: the error botocore
raises, or the call that times out; and whether the broker applied the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from tests.support.sqs_proxy import (
    CHANGE_BATCH,
    DELETE_BATCH,
    RECEIVE,
    Fault,
    SqsProxy,
    sqs_proxy,
)
from tests.support.sqs_server import REGION, SqsServer, sqs_server
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture
def proxy(moto: SqsServer) -> Iterator[SqsProxy]:
    with sqs_proxy(moto.endpoint, latency_seconds=2.0) as p:
        yield p


def client(endpoint: str, *, attempts: int = 1, read_timeout: float = 30) -> Any:
    """A client that does not retry unless told to, so each injected fault reaches the test."""
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            retries={"mode": "standard", "total_max_attempts": attempts},
            read_timeout=read_timeout,
        ),
    )


def receive_one(sqs: Any, queue_url: str, visibility: int = 30) -> dict[str, Any]:
    messages = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=1, VisibilityTimeout=visibility
    ).get("Messages", [])
    assert len(messages) == 1, messages
    message: dict[str, Any] = messages[0]
    return message


def release(sqs: Any, queue_url: str, handle: str) -> None:
    sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=0)


def received_twice(sqs: Any, queue_url: str) -> tuple[str, str]:
    """Receive a message, hand it back, receive it again: (first handle, second handle)."""
    first = receive_one(sqs, queue_url)
    release(sqs, queue_url, first["ReceiptHandle"])
    second = receive_one(sqs, queue_url)
    assert second["MessageId"] == first["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    return first["ReceiptHandle"], second["ReceiptHandle"]


def messages_left(moto: SqsServer, queue_url: str) -> int:
    attributes = moto.client().get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def code(error: ClientError) -> str:
    return str(error.response["Error"]["Code"])


# -- receipt-handle rules ------------------------------------------------------------------------


def test_moto_alone_deletes_with_a_replaced_handle(moto: SqsServer) -> None:
    """Why the proxy exists: moto honours a handle that a later receive replaced."""
    sqs = moto.client()
    queue_url = moto.create_queue("lenient")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    old, _ = received_twice(sqs, queue_url)
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=old)
    assert messages_left(moto, queue_url) == 0


@pytest.mark.parametrize("batch", [False, True])
def test_a_delete_with_a_replaced_handle_succeeds_and_deletes_nothing(
    moto: SqsServer, proxy: SqsProxy, batch: bool
) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("stale-delete")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    old, current = received_twice(sqs, queue_url)

    if batch:
        answer = sqs.delete_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": "a", "ReceiptHandle": old}]
        )
        assert [e["Id"] for e in answer["Successful"]] == ["a"]
        assert not answer.get("Failed")
    else:
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=old)  # no error
    assert messages_left(moto, queue_url) == 1
    assert proxy.counts["stale_delete"] == 1

    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=current)
    assert messages_left(moto, queue_url) == 0
    assert proxy.deleted(queue_url) == 1
    assert proxy.in_flight(queue_url) == 0


def test_an_extension_with_a_replaced_handle_is_refused(moto: SqsServer, proxy: SqsProxy) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("stale-extend")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    old, current = received_twice(sqs, queue_url)

    with pytest.raises(ClientError) as refused:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=old, VisibilityTimeout=60)
    assert code(refused.value) == "ReceiptHandleIsInvalid"

    # In a batch, only the replaced handle's entry fails; the current one is extended.
    answer = sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "old", "ReceiptHandle": old, "VisibilityTimeout": 60},
            {"Id": "current", "ReceiptHandle": current, "VisibilityTimeout": 60},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["current"]
    assert [(e["Id"], e["Code"]) for e in answer["Failed"]] == [("old", "ReceiptHandleIsInvalid")]
    assert proxy.in_flight(queue_url) == 1


def test_an_extension_after_the_deadline_is_refused_as_not_in_flight(
    moto: SqsServer, proxy: SqsProxy
) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("not-in-flight")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url)["ReceiptHandle"]
    release(sqs, queue_url, handle)  # visible again, its handle still the latest
    assert proxy.in_flight(queue_url) == 0

    with pytest.raises(ClientError) as refused:
        release(sqs, queue_url, handle)
    assert code(refused.value) == "AWS.SimpleQueueService.MessageNotInflight"
    answer = sqs.change_message_visibility_batch(
        QueueUrl=queue_url, Entries=[{"Id": "0", "ReceiptHandle": handle, "VisibilityTimeout": 9}]
    )
    assert [(e["Id"], e["Code"]) for e in answer["Failed"]] == [("0", "MessageNotInflight")]
    # moto was never asked: the message is still visible, not hidden again.
    assert receive_one(client(moto.endpoint), queue_url)["MessageId"]


def test_a_visibility_deadline_passing_ends_the_flight(moto: SqsServer, proxy: SqsProxy) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("deadline")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=1)["ReceiptHandle"]
    assert proxy.in_flight(queue_url) == 1
    eventually(lambda: proxy.in_flight(queue_url) == 0, "the visibility to run out")
    with pytest.raises(ClientError) as refused:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=5)
    assert code(refused.value) == "AWS.SimpleQueueService.MessageNotInflight"
    again = receive_one(sqs, queue_url)
    assert proxy.receives(queue_url) == {again["MessageId"]: 2}


# -- faults --------------------------------------------------------------------------------------


def test_a_500_never_reaches_the_broker(moto: SqsServer, proxy: SqsProxy) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("error")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url)["ReceiptHandle"]
    proxy.inject(Fault.ERROR, DELETE_BATCH)
    with pytest.raises(ClientError) as failed:
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=[{"Id": "0", "ReceiptHandle": handle}])
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert code(failed.value) == "InternalError"
    assert messages_left(moto, queue_url) == 1
    assert proxy.counts == {**proxy.counts, "fault.error.DeleteMessageBatch": 1}


@pytest.mark.slow
def test_throttling_is_retried_by_botocore_as_throttling(moto: SqsServer, proxy: SqsProxy) -> None:
    queue_url = moto.create_queue("throttle")
    client(proxy.url).send_message(QueueUrl=queue_url, MessageBody="m")
    proxy.inject(Fault.THROTTLE, RECEIVE)
    with pytest.raises(ClientError) as throttled:
        client(proxy.url).receive_message(QueueUrl=queue_url, WaitTimeSeconds=0)
    assert code(throttled.value) in ("ThrottlingException", "RequestThrottled")
    assert throttled.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400

    proxy.inject(Fault.THROTTLE, RECEIVE, times=2)
    retrying = client(proxy.url, attempts=3)
    assert receive_one(retrying, queue_url)["Body"] == "m"  # the third attempt got through
    assert proxy.counts["fault.throttle.ReceiveMessage"] == 3


def test_a_reset_after_forwarding_applies_the_call_unheard(
    moto: SqsServer, proxy: SqsProxy
) -> None:
    sqs = client(proxy.url)
    queue_url = moto.create_queue("reset")
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url)["ReceiptHandle"]
    proxy.inject(Fault.RESET, DELETE_BATCH)
    with pytest.raises(ConnectionClosedError):
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=[{"Id": "0", "ReceiptHandle": handle}])
    assert messages_left(moto, queue_url) == 0  # the broker deleted it; the client never heard
    assert proxy.deleted(queue_url) == 1

    # A reset receive: the broker handed the message out, the client never got its handle.
    sqs.send_message(QueueUrl=queue_url, MessageBody="n")
    proxy.inject(Fault.RESET, RECEIVE)
    with pytest.raises(ConnectionClosedError):
        sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1, VisibilityTimeout=30)
    assert proxy.in_flight(queue_url) == 1
    assert sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0).get("Messages") is None


@pytest.mark.slow
def test_a_latency_spike_outlasts_a_short_read_timeout(moto: SqsServer, proxy: SqsProxy) -> None:
    queue_url = moto.create_queue("latency")
    sqs = client(proxy.url)
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url)["ReceiptHandle"]
    proxy.inject(Fault.LATENCY, CHANGE_BATCH)
    impatient = client(proxy.url, read_timeout=0.5)
    with pytest.raises(ReadTimeoutError):
        impatient.change_message_visibility_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": "0", "ReceiptHandle": handle, "VisibilityTimeout": 60}],
        )
    # The late call still reached the broker: the extension was applied after all.
    eventually(lambda: proxy.counts["forwarded.ChangeMessageVisibilityBatch"] == 1, "forwarding")
    assert proxy.in_flight(queue_url) == 1


@pytest.mark.slow
def test_faults_by_rate_hit_about_that_share_and_only_consumer_calls(
    moto: SqsServer, proxy: SqsProxy
) -> None:
    queue_url = moto.create_queue("rate")
    sqs = client(proxy.url)
    proxy.set_faults(0.3, kinds=[Fault.ERROR, Fault.THROTTLE])
    for _ in range(20):
        sqs.send_message(QueueUrl=queue_url, MessageBody="m")  # not a consumer call: never hit
    failures = 0
    for _ in range(200):
        try:
            sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0, VisibilityTimeout=0)
        except ClientError:
            failures += 1
    assert failures == proxy.faults()
    assert 30 <= failures <= 90  # 60 expected; a seeded draw, far inside these bounds
    assert all(name.endswith(".ReceiveMessage") for name in proxy.counts if "fault." in name)
    proxy.clear_faults()
    sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0)
