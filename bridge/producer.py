"""Messages the bridge decodes: an SQS or Pub/Sub message for one operation, for producers.

The layout is not a second convention to keep in step: it is read from the subscription's own
decode rules (:class:`~bridge.ingest.decode.DecodeRules`, from ``[subscriptions.<name>.decode]``).
Each identifier goes where its rule looks (an attribute, a JSON pointer into the body), a constant
rule is checked rather than sent, and the payload becomes the raw body or the value at its
pointer. Before a message is handed back it is decoded with those same rules, so a message the
bridge would quarantine is refused here, with the reason, instead of being sent.

The current W3C trace context goes into a ``traceparent`` attribute, the one the consumers read
first, so the bridge's receive and process spans link back to the producer's span.

JSON bodies are written canonically (keys sorted, no whitespace): a producer that builds the same
operation twice sends the same bytes, so a resend is a replay and never a conflict.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge.errors import ProducerError
from bridge.ingest.decode import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DecodeRules,
    FieldSource,
    SourceKind,
    decode,
    identifier_problem,
)
from bridge.outbox.limits import SQS_ID, SQS_TEXT
from bridge.telemetry.propagation import ATTRIBUTE_NAMES
from bridge.types import RawDelivery, Rejection

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from bridge.config import BridgeConfig

#: the attribute the consumers read the producer's trace context from, before any other
TRACEPARENT_ATTRIBUTE: Final = ATTRIBUTE_NAMES[0]
#: SQS: attribute names are letters, digits, '-', '_' and '.', at most 256 characters
_SQS_ATTRIBUTE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_W3C: Final = TraceContextTextMapPropagator()
_UNSET: Final = object()


@dataclass(frozen=True, slots=True)
class SqsMessage:
    """What ``send_message`` takes, without the queue URL."""

    body: str
    attributes: Mapping[str, str]
    #: FIFO queues only: the ordering key the bridge claims in order, and SQS's dedupe id
    group_id: str | None = None
    deduplication_id: str | None = None

    def request(self) -> dict[str, Any]:
        """Keyword arguments for boto3's ``send_message`` (add ``QueueUrl``)."""
        request: dict[str, Any] = {
            "MessageBody": self.body,
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value}
                for name, value in self.attributes.items()
            },
        }
        if self.group_id is not None:
            request["MessageGroupId"] = self.group_id
        if self.deduplication_id is not None:
            request["MessageDeduplicationId"] = self.deduplication_id
        return request

    def entry(self, entry_id: str) -> dict[str, Any]:
        """One entry of ``send_message_batch``; ``entry_id`` is unique within the batch."""
        return {"Id": entry_id, **self.request()}


@dataclass(frozen=True, slots=True)
class PubSubMessage:
    """What ``PublisherClient.publish`` takes, besides the topic."""

    data: bytes
    attributes: Mapping[str, str]
    #: "" for none; with one, the publisher must have message ordering enabled
    ordering_key: str = ""

    def publish(self, publisher: Any, topic: str) -> Any:
        """``publisher.publish(topic, ...)``; returns the client's future."""
        return publisher.publish(
            topic, self.data, ordering_key=self.ordering_key, **dict(self.attributes)
        )


@dataclass(frozen=True, slots=True)
class _Built:
    body: bytes
    attributes: dict[str, str]


@dataclass(frozen=True, slots=True)
class Producer:
    """Builds messages in the layout one subscription's decode rules read."""

    rules: DecodeRules
    #: "sqs" or "pubsub" when known (from the configuration): the other broker is refused
    source: str | None = None
    _body_fields: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rules.operation_id.kind is SourceKind.MESSAGE_ID:
            raise ProducerError(
                f"subscription {self.rules.subscription!r} takes operation ids from the broker's "
                "message id, which a producer cannot choose: a resend would be a new operation; "
                "give the operation id an attribute or a body pointer in its decode rules"
            )
        attributes = [
            s.argument
            for s in (self._sources().values())
            if s is not None and s.kind is SourceKind.ATTRIBUTE
        ]
        if TRACEPARENT_ATTRIBUTE in attributes:
            raise ProducerError(
                f"subscription {self.rules.subscription!r} reads an identifier from the "
                f"{TRACEPARENT_ATTRIBUTE!r} attribute, which carries the trace context: "
                "rename the attribute in its decode rules"
            )
        body = tuple(n for n, s in self._sources().items() if s and s.kind is SourceKind.BODY)
        object.__setattr__(self, "_body_fields", body)

    @classmethod
    def for_subscription(cls, config: BridgeConfig, subscription: str) -> Producer:
        """The producer for ``[subscriptions.<subscription>]`` of a loaded configuration."""
        if subscription not in config.subscriptions:
            known = ", ".join(sorted(config.subscriptions)) or "none"
            raise ProducerError(
                f"{config.file} has no subscription {subscription!r} (it has: {known})"
            )
        return cls(
            config.decode_rules(subscription), str(config.subscriptions[subscription].source)
        )

    def _sources(self) -> dict[str, FieldSource | None]:
        return {
            "tenant_id": self.rules.tenant_id,
            "operation_id": self.rules.operation_id,
            "job_type": self.rules.job_type,
            "schema_version": self.rules.schema_version,
        }

    # -- the two brokers ---------------------------------------------------------------------------

    def sqs(
        self,
        *,
        tenant_id: str | None = None,
        operation_id: str,
        payload: object,
        job_type: str | None = None,
        schema_version: str | None = None,
        priority: int | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        context: Context | None = None,
    ) -> SqsMessage:
        """An SQS message; ``group_id`` makes it a FIFO message.

        A FIFO message's deduplication id defaults to a digest of the operation (tenant and
        operation id), so SQS drops a resend of the same operation within its five-minute
        window; the bridge would replay it anyway.
        """
        self._broker("sqs", "pubsub")
        if group_id is None and deduplication_id is not None:
            raise ProducerError(
                "deduplication_id applies to FIFO queues only: give group_id too, or drop it"
            )
        for name, value in (("group_id", group_id), ("deduplication_id", deduplication_id)):
            if value is not None and not SQS_ID.fullmatch(value):
                raise ProducerError(
                    f"{name} must be 1 to 128 printable ASCII characters without spaces "
                    "(SQS refuses anything else)"
                )
        for name in self._attribute_names():
            if not _SQS_ATTRIBUTE_NAME.fullmatch(name) or name.lower().startswith(
                ("aws.", "amazon.")
            ):
                raise ProducerError(
                    f"SQS refuses the attribute name {name!r} the decode rules use: names are "
                    "letters, digits, '-', '_' and '.', not starting with 'AWS.' or 'Amazon.'"
                )
        built = self._build(
            tenant_id=tenant_id,
            operation_id=operation_id,
            payload=payload,
            job_type=job_type,
            schema_version=schema_version,
            priority=priority,
            ordering_key=group_id,
            context=context,
        )
        try:
            text = built.body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProducerError(
                "SQS message bodies are text and this payload is not UTF-8: encode it (base64, "
                "say) before producing, or use Pub/Sub, whose data is bytes"
            ) from None
        if not SQS_TEXT.fullmatch(text):
            raise ProducerError(
                "the body holds a character SQS refuses (a control character other than tab, "
                "newline or carriage return): escape it in the payload"
            )
        if group_id is not None and deduplication_id is None:
            tenant, operation = self._identity(tenant_id, operation_id)
            deduplication_id = _operation_digest(tenant, operation)
        return SqsMessage(text, built.attributes, group_id, deduplication_id)

    def pubsub(
        self,
        *,
        tenant_id: str | None = None,
        operation_id: str,
        payload: object,
        job_type: str | None = None,
        schema_version: str | None = None,
        priority: int | None = None,
        ordering_key: str | None = None,
        context: Context | None = None,
    ) -> PubSubMessage:
        """A Pub/Sub message; an ``ordering_key`` needs a publisher with ordering enabled."""
        self._broker("pubsub", "sqs")
        for name in self._attribute_names():
            if name.startswith("goog") or len(name.encode("utf-8")) > 256:
                raise ProducerError(
                    f"Pub/Sub refuses the attribute name {name!r} the decode rules use: at most "
                    "256 bytes, not starting with 'goog'"
                )
        built = self._build(
            tenant_id=tenant_id,
            operation_id=operation_id,
            payload=payload,
            job_type=job_type,
            schema_version=schema_version,
            priority=priority,
            ordering_key=ordering_key,
            context=context,
        )
        return PubSubMessage(built.body, built.attributes, ordering_key or "")

    # -- the layout --------------------------------------------------------------------------------

    def _broker(self, wanted: str, other: str) -> None:
        if self.source is not None and self.source != wanted:
            raise ProducerError(
                f"subscription {self.rules.subscription!r} reads {self.source}, not {wanted}: "
                f"build its messages with {other}()"
            )

    def _attribute_names(self) -> list[str]:
        sources = [*self._sources().values(), self.rules.priority]
        return [s.argument for s in sources if s is not None and s.kind is SourceKind.ATTRIBUTE]

    def _priority(self, given: int | None) -> int | None:
        """The priority the message carries, checked against ``decode.priority``."""
        source = self.rules.priority
        where = f"subscription {self.rules.subscription!r}"
        if given is None:
            return None  # the job type's priority applies
        if source is None:
            raise ProducerError(
                f"{where} reads no priority (decode.priority is unset): drop priority, or add "
                "the rule to the subscription (the job type's priority applies meanwhile)"
            )
        if type(given) is not int or not PRIORITY_MIN <= given <= PRIORITY_MAX:
            raise ProducerError(
                f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}"
            )
        if source.kind is SourceKind.VALUE and str(given) != source.argument:
            raise ProducerError(
                f'{where} gives every message one priority (decode.priority = "{source}"): '
                "drop priority"
            )
        return given

    def _identity(self, tenant_id: str | None, operation_id: str) -> tuple[str, str]:
        tenant = self._value("tenant_id", self.rules.tenant_id, tenant_id)
        assert tenant is not None  # a tenant rule always exists
        return tenant, operation_id

    def _value(self, name: str, source: FieldSource | None, given: str | None) -> str | None:
        """The value the message must carry for ``name``, checked against its rule."""
        where = f"subscription {self.rules.subscription!r}"
        if source is None:
            if given is not None:
                raise ProducerError(
                    f"{where} reads no {name} (decode.{name} is unset): drop {name}, or add the "
                    "rule to the subscription"
                )
            return None
        if source.kind is SourceKind.VALUE:
            if given is not None and given != source.argument:
                raise ProducerError(
                    f'{where} carries one {name} only (decode.{name} = "{source}"), and this '
                    f"is another: send it to the subscription that carries it"
                )
            return source.argument
        if given is None:
            raise ProducerError(f"{name} is required: {where} reads it from {source.describe()}")
        if not isinstance(given, str):
            raise ProducerError(
                f"{name} must be a string, not {type(given).__name__}: identifiers are text, "
                "never converted"
            )
        problem = identifier_problem(given)
        if problem is not None:
            raise ProducerError(f"{name} {problem}: the bridge would quarantine the message")
        return given

    def _place_priority(
        self, level: int | None, attributes: dict[str, str], document: object
    ) -> object:
        """Where ``decode.priority`` reads it: an attribute's decimal text, a body's integer."""
        rule = self.rules.priority
        if level is None or rule is None:
            return document
        if rule.kind is SourceKind.ATTRIBUTE:
            attributes[rule.argument] = str(level)
        elif rule.kind is SourceKind.BODY:
            return _place(document, rule.tokens, level, "priority")
        return document

    def _build(
        self,
        *,
        tenant_id: str | None,
        operation_id: str,
        payload: object,
        job_type: str | None,
        schema_version: str | None,
        priority: int | None,
        ordering_key: str | None,
        context: Context | None,
    ) -> _Built:
        values = {
            "tenant_id": self._value("tenant_id", self.rules.tenant_id, tenant_id),
            "operation_id": self._value("operation_id", self.rules.operation_id, operation_id),
            "job_type": self._value("job_type", self.rules.job_type, job_type),
            "schema_version": self._value(
                "schema_version", self.rules.schema_version, schema_version
            ),
        }
        job = values["job_type"]
        if job is not None and job not in self.rules.jobs:
            accepted = ", ".join(sorted(self.rules.jobs))
            raise ProducerError(
                f"job type {job!r} is not one subscription {self.rules.subscription!r} accepts "
                f"({accepted}): send it where it is configured, or add it to job_types"
            )
        version = values["schema_version"]
        if (
            version is not None
            and self.rules.schema_versions
            and (version not in self.rules.schema_versions)
        ):
            accepted = ", ".join(sorted(self.rules.schema_versions))
            raise ProducerError(
                f"schema version {version!r} is not one subscription "
                f"{self.rules.subscription!r} accepts ({accepted})"
            )
        attributes: dict[str, str] = {}
        document: object = _UNSET
        if self.rules.payload.pointer is not None:
            if isinstance(payload, (bytes, bytearray, memoryview)):
                raise ProducerError(
                    f"subscription {self.rules.subscription!r} takes the payload from body "
                    f"pointer {self.rules.payload.pointer!r}: pass the JSON value, not bytes"
                )
            document = _place(document, self.rules.payload.tokens, payload, "the payload")
        for name, source in self._sources().items():
            value = values[name]
            if source is None or value is None:
                continue
            if source.kind is SourceKind.ATTRIBUTE:
                attributes[source.argument] = value
            elif source.kind is SourceKind.BODY:
                document = _place(document, source.tokens, value, name)
        level = self._priority(priority)
        document = self._place_priority(level, attributes, document)
        if self.rules.payload.pointer is None:
            body = self._raw_body(payload, document)
        else:
            body = _canonical(document)
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=context)
        if TRACEPARENT_ATTRIBUTE in carrier:
            attributes[TRACEPARENT_ATTRIBUTE] = carrier[TRACEPARENT_ATTRIBUTE]
        self._verify(body, attributes, ordering_key, values, level)
        return _Built(body, attributes)

    def _raw_body(self, payload: object, document: object) -> bytes:
        """The payload is the body byte for byte: bytes as given, text as UTF-8, else JSON."""
        if document is not _UNSET:
            # Identifiers inside a body that is hashed whole: the payload must already hold them.
            if not isinstance(payload, Mapping):
                fields = ", ".join(self._body_fields)
                raise ProducerError(
                    f"subscription {self.rules.subscription!r} reads {fields} from a body it "
                    "also hashes whole: pass the payload as a JSON object"
                )
            merged: object = dict(payload)
            for name in self._body_fields:
                source = self._sources()[name]
                assert source is not None
                merged = _place(merged, source.tokens, _resolve(document, source.tokens), name)
            return _canonical(merged)
        if isinstance(payload, (bytes, bytearray, memoryview)):
            return bytes(payload)
        if isinstance(payload, str):
            return _utf8(payload)
        return _canonical(payload)

    def _verify(
        self,
        body: bytes,
        attributes: Mapping[str, str],
        ordering_key: str | None,
        values: Mapping[str, str | None],
        priority: int | None,
    ) -> None:
        """Decode the message with the subscription's rules: what is sent is what is read."""
        raw = RawDelivery(
            subscription=self.rules.subscription,
            message_id=None,
            body=body,
            attributes=attributes,
            ordering_key=ordering_key,
        )
        decoded = decode(self.rules, raw)
        if isinstance(decoded, Rejection):
            raise ProducerError(
                f"subscription {self.rules.subscription!r} would quarantine this message "
                f"({decoded.reason}); fix the input named there"
            )
        read = {
            "tenant_id": decoded.tenant_id,
            "operation_id": decoded.operation_id,
            "job_type": decoded.job_type,
            "schema_version": decoded.schema_version,
        }
        if read != dict(values):  # cannot happen: the layout is the rules' own
            raise ProducerError("the message decodes to another operation: please report this")
        if priority is not None and decoded.priority != priority:  # cannot happen either
            raise ProducerError("the message decodes to another priority: please report this")


def _operation_digest(tenant_id: str, operation_id: str) -> str:
    """A stable SQS deduplication id for an operation (length-prefixed parts, sha256 hex)."""
    digest = hashlib.sha256()
    for part in ("fencebridge-dedupe", tenant_id, operation_id):
        raw = part.encode("utf-8")
        digest.update(len(raw).to_bytes(4, "big") + raw)
    return digest.hexdigest()


def _canonical(value: object) -> bytes:
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise ProducerError(
            f"the body cannot be written as strict JSON ({exc}): pass JSON values only (dict "
            "with string keys, list, str, int, finite float, bool, None), or bytes for a raw "
            "body"
        ) from None
    return _utf8(text)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProducerError(
            "the payload holds a lone surrogate, which is not Unicode text: fix the string "
            "(it usually comes from decoding bytes with errors='surrogateescape')"
        ) from None


def _resolve(document: object, tokens: tuple[str, ...]) -> object:
    node = document
    for token in tokens:
        node = node[int(token)] if isinstance(node, list) else node[token]  # type: ignore[index]
    return node


def _place(document: object, tokens: tuple[str, ...], value: object, name: str) -> object:
    """``document`` with ``value`` at the pointer; objects are created on the way."""
    if not tokens:
        if document is not _UNSET and document != value:
            raise ProducerError(
                f"{name} cannot go in the body: another value is already at its pointer (in the "
                "payload, or another identifier's); change one of them or the decode rules"
            )
        return value
    node: Any = {} if document is _UNSET else document
    if isinstance(node, Mapping):
        node = dict(node)
        head = tokens[0]
        node[head] = _place(node.get(head, _UNSET), tokens[1:], value, name)
        return node
    if isinstance(node, list) and tokens[0].isdigit() and int(tokens[0]) < len(node):
        node = list(node)
        index = int(tokens[0])
        node[index] = _place(node[index], tokens[1:], value, name)
        return node
    raise ProducerError(
        f"{name} cannot be placed in the body: its pointer runs through a value that is not a "
        "JSON object; change the payload or the decode rules"
    )
