"""The ``sns`` outbox sink: publishes a destination's messages to an SNS topic.

Like the ``sqs`` sink (whose limits and batching, by count and by bytes, it shares): every
message carries its id in the ``fencebridge-message-id`` attribute and its trace context in
``traceparent``; a FIFO topic (a ``.fifo`` ARN) also gets ``MessageDeduplicationId`` = the
message id and ``MessageGroupId`` = the ordering key (or the operation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.adapters.kit import DestinationConfig, OutboxMessage, Refused, SinkAdapter
from consumers.sqs.sink import LIMITS, AwsSinkSettings, aws_client, batch_entry, send_batches


class SnsSinkSettings(AwsSinkSettings):
    """An SNS topic: `address` is the topic's ARN (a FIFO topic by its `.fifo` name)."""

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if address.startswith("arn:"):
            return None
        return "an sns destination's address is a topic ARN (arn:aws:sns:...)"


class SnsSink:
    """Publishes to one topic (``address``: its ARN)."""

    def __init__(self, client: Any, topic_arn: str) -> None:
        self._client = client
        self._topic_arn = topic_arn
        self.fifo = topic_arn.endswith(".fifo")

    def _entry(self, message: OutboxMessage) -> dict[str, Any] | Refused:
        return batch_entry(message, "Message", fifo=self.fifo)

    def _call(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = self._client.publish_batch(
            TopicArn=self._topic_arn, PublishBatchRequestEntries=entries
        )
        failed: list[dict[str, Any]] = response.get("Failed", [])
        return failed

    def send(self, messages: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        return send_batches(messages, self._call, self._entry, fifo=self.fifo, service="SNS")

    def close(self) -> None:
        self._client.close()


def open_sink(name: str, config: DestinationConfig) -> SnsSink:
    return SnsSink(aws_client("sns", config), config.address)


SINK = SinkAdapter(
    open=open_sink, settings=SnsSinkSettings, messaging_system="aws_sns", limits=LIMITS
)
