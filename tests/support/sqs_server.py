"""A local SQS endpoint for tests: moto's server on a free port, spoken to over real HTTP.

:func:`sqs_server` runs it on threads of the test process; :func:`sqs_server_process` in a
process of its own, for tests whose volume would otherwise share one interpreter lock between
moto, the test and whatever else the test runs in process (the SQS proxy).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
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


@contextmanager
def sqs_server_process(start_seconds: float = 60.0) -> Iterator[SqsServer]:
    """``python -m moto.server`` on 127.0.0.1 and a free port, in its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
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
