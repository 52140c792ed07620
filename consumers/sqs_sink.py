"""The ``sqs`` outbox sink: sends a destination's messages to an SQS queue.

FIFO queues (a ``.fifo`` queue URL) get ``MessageDeduplicationId`` = the message id, so SQS
drops a copy the relay sends again within its five-minute deduplication window, and
``MessageGroupId`` = the ordering key (the operation's messages form one group when none is
given). Standard queues have no deduplication: every message carries its id in the
``fencebridge-message-id`` attribute (FIFO ones too, for consumers that keep ids longer than
five minutes), and its consumers deduplicate on it. The relay's trace context travels in the
``traceparent`` attribute.

A batch call holds at most one message per group of a FIFO queue, so a refused message never
has a later message of its group sent in the same call. The batching is shared with the ``sns``
sink (:func:`send_batches`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from bridge.config.model import DestinationConfig
from bridge.errors import ConfigError
from bridge.outbox import OutboxMessage
from bridge.outbox_limits import LEAST_COMMON
from bridge.sinks import Refusal, Refused, SinkAdapter, SinkUnavailable

#: What SQS and SNS accept of one message (:data:`bridge.outbox_limits.LEAST_COMMON` cites
#: their documentation): the narrowest rules are theirs, less Pub/Sub's reserved prefix.
LIMITS: Final = dataclasses.replace(LEAST_COMMON, reserved_prefixes=("aws.", "amazon."))
#: SQS and SNS send at most 10 messages per batch call
MAX_BATCH: Final = 10

#: (entries of one call) -> the response's ``Failed`` list
BatchCall = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
#: (message, fifo) -> one batch entry without its ``Id``, or a refusal when it cannot be sent
EntryOf = Callable[[OutboxMessage], "dict[str, Any] | Refused"]


def group_of(message: OutboxMessage) -> str:
    """The message's ordering group: its key, or its operation (the id without its number)."""
    return message.ordering_key or message.message_id.rpartition(".")[0] or message.message_id


def text_body(message: OutboxMessage) -> str | Refused:
    """SQS and SNS carry text: a body that is not UTF-8 cannot be sent as it is."""
    try:
        return message.body.decode("utf-8")
    except UnicodeDecodeError:
        return Refused(Refusal.INVALID, "body is not UTF-8 text (SQS and SNS carry text)")


def string_attributes(message: OutboxMessage) -> dict[str, dict[str, str]]:
    return {
        name: {"DataType": "String", "StringValue": value}
        for name, value in message.sent_attributes().items()
    }


def send_batches(
    messages: Sequence[OutboxMessage],
    call: BatchCall,
    entry_of: EntryOf,
    *,
    fifo: bool,
    service: str,
) -> Mapping[str, Refused]:
    """Send in order, in batch calls; the refused messages by id.

    A call that raises before any message was sent raises :class:`SinkUnavailable`; after some
    were, the rest are reported held (not tried), so what was sent is marked sent.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    refused: dict[str, Refused] = {}
    failed_groups: set[str] = set()
    waiting = list(messages)
    sent_any = False
    while waiting:
        chunk: list[tuple[OutboxMessage, dict[str, Any]]] = []
        later: list[OutboxMessage] = []
        groups: set[str] = set()
        for message in waiting:
            group = group_of(message)
            if message.ordering_key is not None and group in failed_groups:
                refused[message.message_id] = Refused(Refusal.HELD, "an earlier message of its key")
                continue
            if len(chunk) >= MAX_BATCH or (fifo and group in groups):
                later.append(message)
                continue
            entry = entry_of(message)
            if isinstance(entry, Refused):
                refused[message.message_id] = entry
                failed_groups.add(group)
                continue
            entry["Id"] = str(len(chunk))
            chunk.append((message, entry))
            groups.add(group)
        waiting = later
        if not chunk:
            continue
        try:
            failures = call([entry for _, entry in chunk])
        except (BotoCoreError, ClientError) as exc:
            code = _code(exc)
            if not sent_any:
                raise SinkUnavailable(f"{service} send failed: {code}") from exc
            for message in [m for m, _ in chunk] + waiting:
                refused[message.message_id] = Refused(Refusal.HELD, f"send failed: {code}")
            return refused
        sent_any = True
        for failure in failures:
            message = chunk[int(failure["Id"])][0]
            kind = Refusal.INVALID if failure.get("SenderFault") else Refusal.RETRY
            refused[message.message_id] = Refused(kind, str(failure.get("Code", "refused")))
            failed_groups.add(group_of(message))
    return refused


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", type(exc).__name__))
    return type(exc).__name__


def aws_client(service: Literal["sqs", "sns"], config: DestinationConfig) -> Any:
    import boto3  # noqa: PLC0415  (only when such a destination is configured)
    from botocore.config import Config  # noqa: PLC0415

    return boto3.session.Session().client(
        service,
        region_name=config.region,
        endpoint_url=config.endpoint_url,
        config=Config(connect_timeout=5, read_timeout=10, retries={"mode": "standard"}),
    )


def batch_entry(message: OutboxMessage, body_key: str, *, fifo: bool) -> dict[str, Any] | Refused:
    """One entry of an SQS or SNS batch call (they differ in the body's key): the body as
    text, the string attributes, and on a FIFO destination the message id as the
    deduplication id and the ordering key's group."""
    body = text_body(message)
    if isinstance(body, Refused):
        return body
    entry: dict[str, Any] = {body_key: body, "MessageAttributes": string_attributes(message)}
    if fifo:
        entry["MessageDeduplicationId"] = message.message_id
        entry["MessageGroupId"] = group_of(message)
    return entry


class SqsSink:
    """Sends to one queue (``address``: its URL)."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url
        self.fifo = queue_url.endswith(".fifo")

    def _entry(self, message: OutboxMessage) -> dict[str, Any] | Refused:
        return batch_entry(message, "MessageBody", fifo=self.fifo)

    def _call(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = self._client.send_message_batch(QueueUrl=self._queue_url, Entries=entries)
        failed: list[dict[str, Any]] = response.get("Failed", [])
        return failed

    def send(self, messages: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        return send_batches(messages, self._call, self._entry, fifo=self.fifo, service="SQS")

    def close(self) -> None:
        self._client.close()


def open_sink(name: str, config: DestinationConfig) -> SqsSink:
    if not config.address.startswith(("https://", "http://")):
        raise ConfigError(f"outbox.{name}.address: an sqs destination's address is its queue URL")
    return SqsSink(aws_client("sqs", config), config.address)


SINK = SinkAdapter(open=open_sink, messaging_system="aws_sqs", limits=LIMITS)
