"""The outbox relay's test pieces against moto's SQS: a destination's table, a sink on an
endpoint, and a drain of what a queue received."""

from __future__ import annotations

from typing import Any

import boto3

from bridge.config import read_destination
from bridge.config.model import DestinationConfig
from consumers.sqs.sink import SqsSink
from tests.support.sqs_server import REGION, SqsServer


def destination(url: str, *, name: str = "refunds", **overrides: Any) -> DestinationConfig:
    """An ``sqs`` destination that relays quickly: short lease, poll and backoff."""
    table: dict[str, Any] = {
        "sink": "sqs",
        "address": url,
        "region": REGION,
        "batch": 50,
        "lease_seconds": 5.0,
        "poll_interval_seconds": 0.05,
        "send_tries": 5,
        "retry_initial_seconds": 0.01,
        "retry_max_seconds": 0.2,
        **overrides,
    }
    return read_destination(name, table)


def sqs_sink(endpoint: str, queue_url: str) -> SqsSink:
    """The ``sqs`` sink on ``endpoint`` (moto, or a proxy in front of it)."""
    client = boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return SqsSink(client, queue_url)


def drain(server: SqsServer, queue_url: str, expected: int) -> list[dict[str, Any]]:
    """Receive and delete until ``expected`` messages came and the queue stays empty."""
    client = server.client()
    got: list[dict[str, Any]] = []
    empty = 0
    while empty < 3 or len(got) < expected:
        response = client.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            AttributeNames=["MessageGroupId"],
            WaitTimeSeconds=1 if len(got) >= expected else 0,
        )
        batch = response.get("Messages", [])
        if not batch:
            empty += 1
            if len(got) < expected and empty > 60:
                break
            continue
        empty = 0
        got.extend(batch)
        client.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
            ],
        )
    return got
