"""Broker fixtures for the consumer tests: moto's SQS server and Google's Pub/Sub emulator.

Both start once per session; every test gets its own queue or topic and subscription.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import conninfo

from bridge.store import PostgresStore
from tests.support.pubsub_emulator import PubSubEmulator, pubsub_emulator, require_launcher
from tests.support.sqs_server import SqsServer, sqs_server


@pytest.fixture(scope="session")
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture(scope="session")
def pubsub_session() -> Iterator[PubSubEmulator]:
    """The session's emulator; skipped (or failed under CI) when it is not installed."""
    with pubsub_emulator(require_launcher()) as emulator:
        yield emulator


@pytest.fixture
def emulator(pubsub_session: PubSubEmulator) -> PubSubEmulator:
    """The emulator, running: a test may kill it; the next one finds it up again."""
    pubsub_session.start()
    return pubsub_session


@pytest.fixture
def impatient_store(db_url: str) -> Iterator[PostgresStore]:
    """A store on the test's database whose statements give up after 300 ms waiting for a lock."""
    store = PostgresStore.connect(
        conninfo.make_conninfo(db_url, options="-c lock_timeout=300"), max_size=4
    )
    try:
        yield store
    finally:
        store.close()
