"""The consumer contract, run against the SQS adapter and moto's server over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from bridge.ingest.inbox import Inbox
from consumers.sqs.source import SqsConsumer
from tests.integration.consumers.conformance import SUBSCRIPTION, ConsumerConformance, Outgoing
from tests.support.sqs_server import SqsServer

#: short, so that a delivery whose write failed comes back quickly
VISIBILITY_SECONDS = 3


class SqsBroker:
    ack_counter = "deleted"

    def __init__(self, server: SqsServer) -> None:
        self._server = server
        self._client = server.client()
        self.queue_url = server.create_queue(VisibilityTimeout=str(VISIBILITY_SECONDS))
        self._consumers: list[SqsConsumer] = []

    def publish(self, messages: Sequence[Outgoing]) -> list[str]:
        ids: list[str] = []
        for start in range(0, len(messages), 10):
            chunk = messages[start : start + 10]
            entries = [
                {
                    "Id": str(i),
                    "MessageBody": m.body.decode(),
                    "MessageAttributes": {
                        k: {"DataType": "String", "StringValue": v} for k, v in m.attributes.items()
                    },
                }
                for i, m in enumerate(chunk)
            ]
            response = self._client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            assert not response.get("Failed"), response.get("Failed")
            sent = {int(s["Id"]): s["MessageId"] for s in response["Successful"]}
            ids += [sent[i] for i in range(len(chunk))]
        return ids

    def consumer(self, inbox: Inbox) -> SqsConsumer:
        consumer = SqsConsumer(
            self._server.client(),
            self.queue_url,
            SUBSCRIPTION,
            inbox,
            wait_seconds=1,
            visibility_timeout=VISIBILITY_SECONDS,
        )
        self._consumers.append(consumer)
        consumer.start()
        return consumer

    def deliverable(self) -> int:
        names: Any = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        found = self._client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=names)
        return sum(int(v) for v in found["Attributes"].values())

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.stop(deadline=10)


@pytest.mark.promise("ack-after-commit-sqs")
class TestSqsConformance(ConsumerConformance):
    @pytest.fixture
    def broker(self, sqs: SqsServer) -> Iterator[SqsBroker]:
        broker = SqsBroker(sqs)
        try:
            yield broker
        finally:
            broker.close()
