"""The ``pubsub`` outbox sink: publishes a destination's messages to a Pub/Sub topic.

The publisher runs with message ordering on, so messages with an ordering key are published in
the order given; once one of a key fails, the client refuses the key's later messages until it
is resumed, and they are reported held (the relay sends them in a later round, after the
failed one). Every message carries its id in the ``fencebridge-message-id`` attribute (Pub/Sub
has no publish-side deduplication: consumers deduplicate on it) and its trace context in
``traceparent``. ``PUBSUB_EMULATOR_HOST`` points the client at an emulator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bridge.config.model import DestinationConfig
from bridge.errors import ConfigError
from bridge.outbox import OutboxMessage
from bridge.outbox_limits import MessageLimits
from bridge.sinks import Refusal, Refused, SinkAdapter, SinkUnavailable

#: how long one publish may take before it counts as failed (it may still have been published)
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
        from google.api_core import exceptions as gexc  # noqa: PLC0415
        from google.cloud.pubsub_v1.publisher import exceptions as pexc  # noqa: PLC0415

        futures = [
            (
                m,
                self._publisher.publish(
                    self._topic, m.body, ordering_key=m.ordering_key or "", **m.sent_attributes()
                ),
            )
            for m in messages
        ]
        refused: dict[str, Refused] = {}
        failed_keys: set[str] = set()
        errors: list[BaseException] = []
        for message, future in futures:
            try:
                future.result(timeout=PUBLISH_TIMEOUT_SECONDS)
            except pexc.PublishToPausedOrderingKeyException:
                refused[message.message_id] = Refused(Refusal.HELD, "an earlier message of its key")
            except (gexc.InvalidArgument, gexc.FailedPrecondition) as exc:
                refused[message.message_id] = Refused(Refusal.INVALID, type(exc).__name__)
                errors.append(exc)
            except Exception as exc:  # noqa: BLE001  (any other failure: send again later)
                refused[message.message_id] = Refused(Refusal.RETRY, type(exc).__name__)
                errors.append(exc)
            else:
                continue
            if message.ordering_key:
                failed_keys.add(message.ordering_key)
        for key in failed_keys:
            self._publisher.resume_publish(self._topic, key)
        if (
            errors
            and len(refused) == len(messages)
            and all(r.kind is not Refusal.INVALID for r in refused.values())
        ):
            # Nothing went through: the service is down or cut off, not these messages.
            raise SinkUnavailable(f"Pub/Sub publish failed: {type(errors[0]).__name__}")
        return refused

    def close(self) -> None:
        stop = getattr(self._publisher, "stop", None)
        if callable(stop):
            stop()


def open_sink(name: str, config: DestinationConfig) -> PubSubSink:
    from google.cloud import pubsub_v1  # noqa: PLC0415  (only when such a destination is configured)

    if not _TOPIC.match(config.address):
        raise ConfigError(
            f"outbox.{name}.address: a pubsub destination's address is "
            "projects/<project>/topics/<topic>"
        )
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    return PubSubSink(publisher, config.address)


SINK = SinkAdapter(open=open_sink, messaging_system="gcp_pubsub", limits=LIMITS)
