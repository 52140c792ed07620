"""The consumer contract, run against the Pub/Sub adapter and Google's emulator over gRPC.

The subscription has exactly-once delivery on, so every ack the consumer counts was confirmed
by the emulator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from bridge.ingest.inbox import Inbox
from consumers.pubsub.source import PubSubConsumer, subscriber_client
from tests.integration.consumers.conformance import SUBSCRIPTION, ConsumerConformance, Outgoing
from tests.support.pubsub_emulator import PubSubEmulator


class PubSubBroker:
    ack_counter = "acked"

    def __init__(self, emulator: PubSubEmulator) -> None:
        self._emulator = emulator
        self.topic, self.path = emulator.create(enable_exactly_once_delivery=True)
        self._consumers: list[PubSubConsumer] = []

    def publish(self, messages: Sequence[Outgoing]) -> list[str]:
        return self._emulator.publish_many(self.topic, [(m.body, m.attributes) for m in messages])

    def consumer(self, inbox: Inbox) -> PubSubConsumer:
        consumer = PubSubConsumer(
            subscriber_client(self._emulator.host),
            self.path,
            SUBSCRIPTION,
            inbox,
            batch_max_wait_ms=20,
            probe_interval=1.0,
            close_client=True,
        )
        self._consumers.append(consumer)
        consumer.start()
        return consumer

    def deliverable(self) -> int:
        return len(self._emulator.deliverable(self.path))

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.stop(deadline=10)


@pytest.mark.promise("ack-after-commit-pubsub")
class TestPubSubConformance(ConsumerConformance):
    @pytest.fixture
    def broker(self, emulator: PubSubEmulator) -> Iterator[PubSubBroker]:
        broker = PubSubBroker(emulator)
        try:
            yield broker
        finally:
            broker.close()
