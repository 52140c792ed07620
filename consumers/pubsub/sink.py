"""The ``pubsub`` outbox sink: publishes a destination's messages to a Pub/Sub topic.

The publisher runs with message ordering on, so messages with an ordering key are published in
the order given; once one of a key fails, the client refuses the key's later messages (and
cancels its batches already formed) until it is resumed: they are reported held, not counted,
and the relay sends them in a later round, after the failed one. The client sends a batch in
one request, which the service refuses as a whole for one message it will not take (a body
the topic's schema refuses, say): the messages of a call refused so are published again one
at a time, and only the ones refused alone are invalid. One deadline covers the call.

Every message carries its id in the ``fencebridge-message-id`` attribute (Pub/Sub has no
publish-side deduplication: consumers deduplicate on it) and its trace context in
``traceparent``. ``PUBSUB_EMULATOR_HOST`` points the client at an emulator.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bridge.adapters.kit import (
    DestinationConfig,
    MessageLimits,
    OutboxMessage,
    Refusal,
    Refused,
    SinkAdapter,
    SinkSettings,
)
from bridge.errors import SinkUnavailable

#: how long one call's publishes may take before the ones left count as failed (they may
#: still be published: the client keeps retrying an ordered key's batch)
PUBLISH_TIMEOUT_SECONDS: Final = 30.0
_TOPIC: Final = re.compile(r"^projects/[^/]+/topics/[^/]+$")
#: What Pub/Sub accepts of one message, from its resource limits (Pub/Sub "Quotas and
#: limits", https://cloud.google.com/pubsub/quotas#resource_limits): a message of 10 MB
#: (the client refuses a publish request over 10,000,000 bytes, the topic's name and the
#: encoding's framing included, so 2,048 bytes are kept for those), 100 attributes, an
#: attribute key of 256 bytes and a value of 1,024 (the service's own refusal: "the maximum
#: allowed is 1024", googleapis/google-cloud-python#7906), an ordering key of 1,024 bytes;
#: keys starting with ``goog`` are the service's.
LIMITS: Final = MessageLimits(
    broker="Pub/Sub",
    max_message_bytes=10_000_000 - 2_048,
    counts_ordering_key=True,
    max_attributes=100,
    attribute_name=re.compile(r".+", re.DOTALL),
    attribute_name_rule="1 to 256 bytes",
    max_attribute_name_bytes=256,
    max_attribute_value_bytes=1_024,
    reserved_prefixes=("goog",),
    ordering_key=re.compile(r".+", re.DOTALL),
    ordering_key_rule="1 to 1,024 bytes",
    max_ordering_key_bytes=1_024,
)


class PubSubSink:
    """Publishes to one topic (``address``: ``projects/<project>/topics/<topic>``)."""

    def __init__(self, publisher: Any, topic: str) -> None:
        self._publisher = publisher
        self._topic = topic

    def send(self, messages: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        deadline = time.monotonic() + PUBLISH_TIMEOUT_SECONDS
        published = [(m, self._publish(m)) for m in messages]
        refused: dict[str, Refused] = {}
        failed_keys: set[str] = set()
        invalid: list[tuple[OutboxMessage, Refused]] = []
        errors: list[BaseException] = []
        for message, outcome in published:
            error = _outcome(outcome, deadline)
            if error is None:
                continue
            refusal = _refusal(error)
            if refusal.kind is Refusal.INVALID:
                invalid.append((message, refusal))
            else:
                refused[message.message_id] = refusal
            if refusal.kind is not Refusal.HELD:
                errors.append(error)
            if message.ordering_key:
                failed_keys.add(message.ordering_key)
        if len(invalid) > 1:
            # refused together: the service refuses a request as a whole for one message of it
            refused.update(self._alone([m for m, _ in invalid], deadline))
        else:
            refused.update({m.message_id: r for m, r in invalid})
        for key in failed_keys:
            self._resume(key)
        if (
            errors
            and len(refused) == len(messages)
            and all(r.kind is not Refusal.INVALID for r in refused.values())
        ):
            # Nothing went through: the service is down or cut off, not these messages.
            raise SinkUnavailable(f"Pub/Sub publish failed: {type(errors[0]).__name__}")
        return refused

    def _alone(self, messages: Sequence[OutboxMessage], deadline: float) -> dict[str, Refused]:
        """Publish each message on its own, in order, each waited for before the next (one per
        request); a key's messages after one refused alone are held."""
        refused: dict[str, Refused] = {}
        stopped: set[str] = set()
        for message in messages:
            key = message.ordering_key or ""
            if key in stopped:
                refused[message.message_id] = Refused(Refusal.HELD, "an earlier message of its key")
                continue
            if key:
                self._resume(key)
            error = _outcome(self._publish(message), deadline)
            if error is None:
                continue
            refused[message.message_id] = _refusal(error)
            if key:
                stopped.add(key)
        return refused

    def _resume(self, key: str) -> None:
        """Let the client publish the key's messages again after a failure paused it.

        The client raises RuntimeError for a key that is not paused: its failure was a publish
        that timed out (still in the client's hands), or it was resumed already; or for a
        stopping client. There is nothing to undo then."""
        with contextlib.suppress(RuntimeError):
            self._publisher.resume_publish(self._topic, key)

    def _publish(self, message: OutboxMessage) -> Any:
        """The client's future for the message, or the error it raised at once (a message too
        large for a request, a stopped client)."""
        try:
            return self._publisher.publish(
                self._topic,
                message.body,
                ordering_key=message.ordering_key or "",
                **message.sent_attributes(),
            )
        except Exception as exc:  # noqa: BLE001  (classified by _refusal)
            return exc

    def close(self) -> None:
        stop = getattr(self._publisher, "stop", None)
        if callable(stop):
            stop()


def _outcome(published: Any, deadline: float) -> BaseException | None:
    """None once the message was published; the error otherwise (waiting until ``deadline``)."""
    if isinstance(published, BaseException):
        return published
    try:
        published.result(timeout=max(0.0, deadline - time.monotonic()))
    except Exception as exc:  # noqa: BLE001  (classified by _refusal)
        return exc
    return None


def _refusal(error: BaseException | None) -> Refused:
    from google.api_core import exceptions as gexc  # noqa: PLC0415
    from google.cloud.pubsub_v1.publisher import exceptions as pexc  # noqa: PLC0415
    from google.cloud.pubsub_v1.publisher._batch.base import (  # noqa: PLC0415
        BatchCancellationReason,
    )

    if isinstance(error, pexc.PublishToPausedOrderingKeyException):
        return Refused(Refusal.HELD, "an earlier message of its key")
    if isinstance(error, RuntimeError) and str(error) in {r.value for r in BatchCancellationReason}:
        # a batch of a key paused by an earlier failure (or of a stopping client), never sent
        return Refused(Refusal.HELD, "its batch was cancelled before it was sent")
    name = type(error).__name__
    invalid = gexc.InvalidArgument | gexc.FailedPrecondition | pexc.MessageTooLargeError
    return Refused(Refusal.INVALID if isinstance(error, invalid) else Refusal.RETRY, name)


class PubSubSinkSettings(SinkSettings):
    """A Pub/Sub topic: `address` is `projects/<project>/topics/<topic>`. The client finds
    its credentials, and a local emulator, in its environment (`PUBSUB_EMULATOR_HOST`)."""

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if _TOPIC.match(address):
            return None
        return "a pubsub destination's address is projects/<project>/topics/<topic>"


def open_sink(name: str, config: DestinationConfig) -> PubSubSink:
    from google.cloud import pubsub_v1  # noqa: PLC0415  (only when such a destination is configured)

    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    return PubSubSink(publisher, config.address)


SINK = SinkAdapter(
    open=open_sink, settings=PubSubSinkSettings, messaging_system="gcp_pubsub", limits=LIMITS
)
