"""The ``sqs`` outbox sink: sends a destination's messages to an SQS queue.

FIFO queues (a ``.fifo`` queue URL) get ``MessageDeduplicationId`` = the message id, so SQS
drops a copy the relay sends again within its five-minute deduplication window, and
``MessageGroupId`` = the ordering key (the operation's messages form one group when none is
given). Standard queues have no deduplication: every message carries its id in the
``fencebridge-message-id`` attribute (FIFO ones too, for consumers that keep ids longer than
five minutes), and its consumers deduplicate on it. The relay's trace context travels in the
``traceparent`` attribute.

A batch call holds at most one message per group of a FIFO queue, so a refused message never
has a later message of its group sent in the same call. A call holds at most ten messages and
262,144 bytes (bodies and attributes, as SQS and SNS count them): a message larger than that
alone is refused as invalid without a call. A call refused as a whole for what it holds (too
long, an invalid parameter) is split in halves and sent again, down to single messages, so
one message the service will not take never holds back the others: refused alone, it counts
as a failed attempt (parked after ``max_attempts``; at once when it alone is too long). The
batching is shared with the ``sns`` sink (:func:`send_batches`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from bridge.adapters.kit import (
    LEAST_COMMON,
    DestinationConfig,
    HttpUrl,
    OutboxMessage,
    Refusal,
    Refused,
    Shown,
    SinkAdapter,
    SinkSettings,
)
from bridge.errors import SinkUnavailable
from consumers.sqs.source import Region

#: What SQS and SNS accept of one message (:data:`bridge.outbox.limits.LEAST_COMMON` cites
#: their documentation): the narrowest rules are theirs, less Pub/Sub's reserved prefix.
LIMITS: Final = dataclasses.replace(LEAST_COMMON, reserved_prefixes=("aws.", "amazon."))
#: SQS and SNS send at most 10 messages per batch call
MAX_BATCH: Final = 10
#: and at most 256 KiB per call: "the maximum total payload size (the sum of the individual
#: lengths of all of the batched messages)" is 262,144 bytes (SQS API Reference,
#: SendMessageBatch; SNS API Reference, PublishBatch), counted as :data:`LIMITS` counts one
MAX_BATCH_BYTES: Final = LIMITS.max_message_bytes
#: whole-call refusals that name what the call holds, not the service's state or the
#: destination's: the call is split and its messages sent again
_REFUSED_AS_SENT: Final = frozenset(
    {
        "BatchRequestTooLong",
        "RequestEntityTooLarge",
        "InvalidParameterValue",
        "InvalidParameter",
        "InvalidMessageContents",
        "MessageAttributesInvalid",
        "InvalidAttributeName",
        "InvalidAttributeValue",
    }
)
#: of those, the ones that make a message sent alone invalid as it is: parked at once
_TOO_LONG: Final = frozenset({"BatchRequestTooLong", "RequestEntityTooLarge"})

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
    """Send in order, in batch calls of at most :data:`MAX_BATCH` messages and
    :data:`MAX_BATCH_BYTES`; the refused messages by id.

    A call refused for what it holds is split (:data:`_REFUSED_AS_SENT`). Any other call that
    raises before a message was sent raises :class:`SinkUnavailable`; after some were, the rest
    are reported held (not tried), so what was sent is marked sent.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    batches = _Batches(messages, entry_of, fifo=fifo)
    sent_any = False
    while batches.waiting:
        chunk = batches.next_call()
        if not chunk:
            continue
        try:
            failures = call([entry for _, entry in chunk])
        except (BotoCoreError, ClientError) as exc:
            code = _code(exc)
            if _short(code) in _REFUSED_AS_SENT:
                batches.refused_as_sent(chunk, code)
                continue
            if not sent_any:
                raise SinkUnavailable(f"{service} send failed: {code}") from exc
            batches.hold([m for m, _ in chunk] + batches.waiting, f"send failed: {code}")
            return batches.refused
        sent_any = True
        for failure in failures:
            kind = Refusal.INVALID if failure.get("SenderFault") else Refusal.RETRY
            code = str(failure.get("Code", "refused"))
            batches.refuse(chunk[int(failure["Id"])][0], Refused(kind, code))
    return batches.refused


class _Batches:
    """One send's messages, handed out as batch calls in their order, and what was refused."""

    def __init__(self, messages: Sequence[OutboxMessage], entry_of: EntryOf, *, fifo: bool) -> None:
        self.waiting = list(messages)
        self.refused: dict[str, Refused] = {}
        self._failed_groups: set[str] = set()
        self._place = {m.message_id: n for n, m in enumerate(messages)}
        self._entries: dict[str, dict[str, Any] | Refused] = {}
        self._entry_of = entry_of
        self._fifo = fifo
        #: messages per call: halved for the rest of the send at each split
        self._most = MAX_BATCH

    def next_call(self) -> list[tuple[OutboxMessage, dict[str, Any]]]:
        """The next call's messages and entries, taken off :attr:`waiting`: the first ones
        that fit, never a message ahead of an earlier one of its group."""
        chunk: list[tuple[OutboxMessage, dict[str, Any]]] = []
        later: list[OutboxMessage] = []
        groups: set[str] = set()
        deferred: set[str] = set()
        size = 0
        for message in self.waiting:
            group = group_of(message)
            if message.ordering_key is not None and group in self._failed_groups:
                self.refused[message.message_id] = Refused(
                    Refusal.HELD, "an earlier message of its key"
                )
                continue
            entry = self._entry(message)
            if isinstance(entry, Refused):
                self.refuse(message, entry)
                continue
            length = message_size(message)
            if (
                len(chunk) >= self._most
                or group in deferred
                or (self._fifo and group in groups)
                or size + length > MAX_BATCH_BYTES
            ):
                later.append(message)
                deferred.add(group)
                continue
            chunk.append((message, {**entry, "Id": str(len(chunk))}))
            groups.add(group)
            size += length
        self.waiting = later
        return chunk

    def refused_as_sent(self, chunk: Sequence[tuple[OutboxMessage, Any]], code: str) -> None:
        """A call refused as a whole for what it holds: split it, or, a message alone, refuse
        it (a failed attempt; invalid at once when it alone is too long)."""
        if len(chunk) > 1:
            self._most = max(1, len(chunk) // 2)
            back = [m for m, _ in chunk] + self.waiting
            self.waiting = sorted(back, key=lambda m: self._place[m.message_id])
            return
        kind = Refusal.INVALID if _short(code) in _TOO_LONG else Refusal.RETRY
        self.refuse(chunk[0][0], Refused(kind, code))

    def refuse(self, message: OutboxMessage, refusal: Refused) -> None:
        self.refused[message.message_id] = refusal
        self._failed_groups.add(group_of(message))

    def hold(self, messages: Sequence[OutboxMessage], reason: str) -> None:
        for message in messages:
            self.refused[message.message_id] = Refused(Refusal.HELD, reason)

    def _entry(self, message: OutboxMessage) -> dict[str, Any] | Refused:
        """The message's batch entry (built once), or a refusal when no call could carry it."""
        found = self._entries.get(message.message_id)
        if found is None:
            length = message_size(message)
            found = (
                Refused(
                    Refusal.INVALID,
                    f"{length} bytes with its attributes, over the {MAX_BATCH_BYTES} SQS and "
                    "SNS take",
                )
                if length > MAX_BATCH_BYTES
                else self._entry_of(message)
            )
            self._entries[message.message_id] = found
        return found


def message_size(message: OutboxMessage) -> int:
    """The message's size as SQS and SNS count it: body and attributes (names, types, values)."""
    return LIMITS.size(message.body, message.sent_attributes(), message.ordering_key)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", type(exc).__name__))
    return type(exc).__name__


def _short(code: str) -> str:
    """An error code without its namespace (``AWS.SimpleQueueService.X``, ``...#XException``)."""
    return code.rpartition(".")[2].rpartition("#")[2].removesuffix("Exception")


class AwsSinkSettings(SinkSettings):
    """The keys an SQS or SNS destination has beside the core's. Credentials come from the AWS
    environment (`AWS_*`, a profile, a role), never from the file."""

    region: Annotated[
        Region | None,
        Shown(default="the AWS environment (`AWS_REGION`, `AWS_DEFAULT_REGION`, profile)"),
    ] = Field(default=None, description="The AWS region of the queue or topic.")
    endpoint_url: Annotated[
        HttpUrl | None, Shown(default="the service's endpoint (or `AWS_ENDPOINT_URL`)")
    ] = Field(
        default=None,
        description="Endpoint of a local server, for development and tests.",
    )


class SqsSinkSettings(AwsSinkSettings):
    """An SQS queue: `address` is the queue's URL, as `GetQueueUrl` returns it (a FIFO queue
    by its `.fifo` name)."""

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if address.startswith(("https://", "http://")):
            return None
        return "an sqs destination's address is its queue URL (http:// or https://)"


def aws_client(service: Literal["sqs", "sns"], config: DestinationConfig) -> Any:
    import boto3  # noqa: PLC0415  (only when such a destination is configured)
    from botocore.config import Config  # noqa: PLC0415

    settings = AwsSinkSettings.of(config)
    return boto3.session.Session().client(
        service,
        region_name=settings.region,
        endpoint_url=settings.endpoint_url,
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
    return SqsSink(aws_client("sqs", config), config.address)


SINK = SinkAdapter(
    open=open_sink, settings=SqsSinkSettings, messaging_system="aws_sqs", limits=LIMITS
)
