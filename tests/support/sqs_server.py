"""A local SQS endpoint for tests: moto's server on a free port, spoken to over real HTTP.

:func:`sqs_server` runs it on threads of the test process; :func:`sqs_server_process` in a
process of its own, for tests whose volume would otherwise share one interpreter lock between
moto, the test and whatever else the test runs in process (the SQS proxy).
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from moto.core.utils import unix_time
from moto.server import ThreadedMotoServer
from moto.sqs.models import SQSBackend

REGION = "us-east-1"


class SqsServer:
    """One running moto server; queues are created per test with unique names."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def client(self) -> Any:
        """A boto3 SQS client for this server (dummy credentials; moto checks none)."""
        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def create_queue(self, prefix: str = "fb", **attributes: str) -> str:
        """A new queue with a unique name; returns its URL."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        response = self.client().create_queue(QueueName=name, Attributes=attributes)
        url: str = response["QueueUrl"]
        return url


#: one queue operation at a time in moto (see :func:`quick_receives`)
_MOTO_LOCK = threading.RLock()
#: how often a long poll looks at the queue again while it waits
_POLL_SECONDS = 0.02


def _retained(backend: Any, queue_name: str, message: Any) -> bool:
    """moto's retention rule for a received message, read from the queue's own setting."""
    retention = int(backend.get_queue(queue_name).message_retention_period)
    return bool(retention + message.sent_timestamp / 1000 > unix_time())


def _serialised(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _MOTO_LOCK:
            return method(*args, **kwargs)

    return call


def _receive(  # noqa: PLR0917  (moto's own signature)
    backend: Any,
    queue_name: str,
    count: int,
    wait_seconds_timeout: int,
    visibility_timeout: int,
    message_attribute_names: list[str] | None = None,
) -> list[Any]:
    """moto's receive, one at a time, its long poll waiting outside the lock."""
    end = time.monotonic() + wait_seconds_timeout
    while True:
        with _MOTO_LOCK:
            found: list[Any] = _RECEIVE(
                backend, queue_name, count, 0, visibility_timeout, message_attribute_names
            )
        if found or time.monotonic() >= end:
            return found
        time.sleep(_POLL_SECONDS)


_RECEIVE = SQSBackend.receive_message


def quick_receives() -> None:
    """Make moto's receive cost what the queue's length does, not its square, and hand each
    message to one receive only.

    moto checks each message it returns against the queue's retention by computing every
    attribute of the queue three times, each counting the whole queue: a receive of ten from a
    thousand-message queue took about a second of CPU, and sixteen long polls timed out in
    moto. The rule applied is the same, read from the queue's setting directly. And moto's
    server runs requests on threads with no lock around a queue: two receives at once can both
    take the same visible message (with one receipt handle between them), which SQS never does
    within a visibility timeout. Receives, deletes, visibility changes and sends run one at a
    time here; a long poll waits between looks, outside the lock.
    """
    SQSBackend.is_message_valid_based_on_retention_period = _retained  # type: ignore[method-assign,assignment]
    SQSBackend.receive_message = _receive  # type: ignore[method-assign,assignment]
    for name in (
        "send_message",
        "send_message_batch",
        "delete_message",
        "delete_message_batch",
        "change_message_visibility",
        "change_message_visibility_batch",
        "purge_queue",
    ):
        method = getattr(SQSBackend, name)
        if not getattr(method, "__wrapped__", None):
            setattr(SQSBackend, name, _serialised(method))


@contextmanager
def sqs_server() -> Iterator[SqsServer]:
    """Start moto's threaded server on 127.0.0.1 and a free port; stop it afterwards."""
    quick_receives()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield SqsServer(f"http://{host}:{port}")
    finally:
        server.stop()


@contextmanager
def sqs_server_process(start_seconds: float = 60.0) -> Iterator[SqsServer]:
    """``python -m moto.server`` on 127.0.0.1 and a free port, in its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = str(Path(__file__).resolve().parents[2])
    main = (
        f"import sys; sys.path.insert(0, {root!r}); "
        "from tests.support.sqs_server import quick_receives; quick_receives(); "
        "from moto.server import main; "
        f"main(['-H', '127.0.0.1', '-p', '{port}'])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", main],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        yield SqsServer(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def send_operations(
    sqs: Any,
    queue_url: str,
    operations: Sequence[str],
    body: object,
    *,
    job_type: Callable[[str], str],
    tenant: str = "t1",
) -> None:
    """One message per operation (its tenant, id and job type as attributes), in batches of
    ten; a message SQS refuses fails the test."""
    for start in range(0, len(operations), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(body),
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": tenant},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": job_type(op)},
                },
            }
            for i, op in enumerate(operations[start : start + 10])
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not response.get("Failed"), response


def queue_empty(sqs: Any, queue_url: str) -> bool:
    """Whether the queue holds no message, visible or in flight (every copy deleted)."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"])
        == 0
        == int(attributes["ApproximateNumberOfMessagesNotVisible"])
    )
