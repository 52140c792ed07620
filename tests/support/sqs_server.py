"""A local SQS endpoint for tests: moto's server on a free port, spoken to over real HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

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


@contextmanager
def sqs_server() -> Iterator[SqsServer]:
    """Start moto's threaded server on 127.0.0.1 and a free port; stop it afterwards."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield SqsServer(f"http://{host}:{port}")
    finally:
        server.stop()
