"""The consumer contract, run against an adapter the core has never heard of.

The memory adapter (``tests/support/memory_source.py``) is registered the way a third-party
package is: a distribution's ``fencebridge.sources`` entry point, found on ``sys.path``. Its
subscription is read by the core's configuration reader, which asks the adapter for its keys,
and its consumer is built through the entry point: a broker is one module and one entry point.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bridge.adapters import sources
from bridge.config import parse_config
from bridge.errors import ConfigError
from bridge.ingest.inbox import Inbox
from bridge.store import PostgresStore
from tests.integration.consumers.conformance import SUBSCRIPTION, ConsumerConformance, Outgoing
from tests.support import memory_source
from tests.support.memory_source import MemoryConsumer, MemorySettings

CONFIG = """\
[jobs.refund]
handler = "app.refunds:handler"
target_class = "C"

[subscriptions.{subscription}]
source = "memory"
{keys}
job_types = ["refund"]

[subscriptions.{subscription}.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/operation"
job_type = "value:refund"
"""


def config_text(keys: str) -> str:
    return CONFIG.format(subscription=SUBSCRIPTION, keys=keys)


@pytest.fixture
def registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory adapter's distribution on ``sys.path``, as if it were installed."""
    monkeypatch.syspath_prepend(str(memory_source.register(tmp_path)))


class MemoryBroker:
    ack_counter = "acked"

    def __init__(self, name: str, store: PostgresStore) -> None:
        self._store = store
        self._queue = memory_source.queue(name)
        self._config = parse_config(config_text(f'queue = "{name}"\nwait_ms = 50'))
        self._consumers: list[MemoryConsumer] = []

    def publish(self, messages: Sequence[Outgoing]) -> list[str]:
        return [self._queue.publish(m.body, dict(m.attributes)) for m in messages]

    def consumer(self, inbox: Inbox) -> MemoryConsumer:
        sub = self._config.subscriptions[SUBSCRIPTION]
        consumer = sources.adapter(sub.source).open(sub, inbox, self._store.inbox)
        assert isinstance(consumer, MemoryConsumer)
        self._consumers.append(consumer)
        consumer.start()
        return consumer

    def deliverable(self) -> int:
        return self._queue.deliverable()

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.stop(deadline=10)


class TestMemoryConformance(ConsumerConformance):
    @pytest.fixture
    def broker(
        self, registered: None, request: pytest.FixtureRequest, store: PostgresStore
    ) -> Iterator[MemoryBroker]:
        broker = MemoryBroker(f"q-{request.node.name}"[:64], store)
        try:
            yield broker
        finally:
            broker.close()


@pytest.mark.usefixtures("registered")
def test_the_core_checks_the_adapters_keys_with_its_own_messages() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config_text("receive_batch = 0\nqueue_url = 'https://q'"), file="b.toml")
    assert str(caught.value).splitlines() == [
        f"b.toml: subscriptions.{SUBSCRIPTION}.queue_url: applies to source = 'sqs' only, and "
        "this subscription's source is 'memory'",
        f"b.toml: subscriptions.{SUBSCRIPTION}.queue: required for source = 'memory'",
        f"b.toml: subscriptions.{SUBSCRIPTION}.receive_batch: must be from 1 to 100, got 0",
    ]
    sub = parse_config(config_text('queue = "q1"')).subscriptions[SUBSCRIPTION]
    settings = MemorySettings.of(sub).model_dump()
    assert settings == {"queue": "q1", "receive_batch": 10, "wait_ms": 200}


def test_without_its_distribution_the_source_is_unknown() -> None:
    with pytest.raises(ConfigError, match="source: expected 'pubsub' or 'sqs', got 'memory'"):
        parse_config(config_text('queue = "q1"'))
