"""The transactional outbox: messages a class A handler publishes with its business write.

Inside ``handle(ctx, tx)`` a handler calls ``ctx.outbox.publish(destination, body, ...)``. The
message is inserted on ``tx``, the transaction that holds the work row under its fence, so it
commits with the business write and the completion or not at all: a stale worker's transaction
never commits, and its messages go with it. Nothing is sent from the handler; the relay
(:mod:`bridge.outbox.relay`) sends committed messages afterwards.

A message's id is deterministic: the operation's opaque idempotency key and the message's number
within the run (``fb1_....1``, ``fb1_....2``, in the order the handler publishes). A run that is
retried publishes the same ids again, so a retry never makes more messages, and every copy the
relay may send carries the same id: consumers deduplicate on it (SQS FIFO queues by
``MessageDeduplicationId``, everything else by the ``fencebridge-message-id`` attribute). The
id carries no raw tenant or operation identifier.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from psycopg.types.json import Jsonb

from bridge import sql
from bridge.outbox.limits import LEAST_COMMON, MessageLimits
from bridge.telemetry.propagation import valid_traceparent

if TYPE_CHECKING:
    from bridge.database import Connection

#: the attribute every sent message carries its id in (consumers deduplicate on it)
MESSAGE_ID_ATTRIBUTE: Final = "fencebridge-message-id"
#: the attribute the writing run's trace context travels in (W3C Trace Context)
TRACEPARENT_ATTRIBUTE: Final = "traceparent"
#: attributes the relay sets itself; a handler may not
RESERVED_ATTRIBUTES: Final = frozenset({MESSAGE_ID_ATTRIBUTE, TRACEPARENT_ATTRIBUTE})
_propagator = TraceContextTextMapPropagator()


class OutboxError(ValueError):
    """A message a handler tried to publish that cannot be recorded as it is.

    A ``ValueError``: an uncaught one ends the run as a terminal failure (rolled back, nothing
    published), since retrying the same input changes nothing.
    """


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A committed message as the relay reads it."""

    message_id: str
    tenant_id: str
    operation_id: str
    body: bytes
    attributes: Mapping[str, str] = field(default_factory=dict)
    ordering_key: str | None = None
    #: W3C traceparent of the run that wrote it
    trace_context: str | None = None
    #: sends of it that failed so far
    attempts: int = 0

    def sent_attributes(self) -> dict[str, str]:
        """The handler's attributes plus the relay's own: the id and the trace context."""
        return {**self.attributes, **relay_attributes(self.message_id, self.trace_context)}


def relay_attributes(message_id: str, trace_context: str | None) -> dict[str, str]:
    """The attributes the relay adds to a message: its id, and the trace context if any."""
    added = {MESSAGE_ID_ATTRIBUTE: message_id}
    if trace_context:
        added[TRACEPARENT_ATTRIBUTE] = trace_context
    return added


def current_traceparent() -> str | None:
    """The active span's context as a traceparent (the run's process span), if there is one."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return valid_traceparent(carrier.get("traceparent"))


class RunIdentity(Protocol):
    """What the outbox reads of the run's context (:class:`bridge.handlers.Context`)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def operation_id(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def idempotency_key(self) -> str: ...


class Outbox:
    """``ctx.outbox`` of one class A run: publishes into the run's fenced transaction."""

    def __init__(
        self,
        tx: Connection,
        ctx: RunIdentity,
        *,
        destinations: Mapping[str, MessageLimits] | None = None,
        trace_context: str | None = None,
    ) -> None:
        self._tx = tx
        self._ctx = ctx
        self._destinations = destinations
        self._trace_context = trace_context
        self._count = 0

    def publish(
        self,
        destination: str,
        body: bytes | str,
        *,
        attributes: Mapping[str, str] | None = None,
        ordering_key: str | None = None,
    ) -> str:
        """Record a message to ``destination`` in this transaction; returns its id.

        It is sent after the transaction commits, by the relay, and only if it commits.
        ``ordering_key`` keeps messages with the same key in order (SQS FIFO message group,
        Pub/Sub ordering key); a destination without ordering ignores it. A message its
        destination's broker would refuse (:mod:`bridge.outbox.limits`) raises
        :class:`OutboxError` here, naming the limit, and takes no number.
        """
        data = _body(body)
        attrs = _attributes(attributes or {})
        limits = LEAST_COMMON
        if self._destinations is not None:
            if destination not in self._destinations:
                known = ", ".join(sorted(self._destinations)) or "none configured"
                raise OutboxError(
                    f"no outbox destination {destination!r} (configured: {known}); add "
                    f"[outbox.{destination}] to the configuration"
                )
            limits = self._destinations[destination]
        ctx = self._ctx
        prefix = ctx.idempotency_key  # derived on first use: most runs never publish
        if not prefix:
            raise OutboxError("the outbox needs the operation's idempotency key for message ids")
        message_id = f"{prefix}.{self._count + 1}"
        trace_context = current_traceparent() or self._trace_context
        problem = limits.problem(
            data,
            attrs,
            ordering_key,
            relay_attributes(message_id, trace_context),
            relay_may_add=len(RESERVED_ATTRIBUTES),
        )
        if problem is not None:
            raise OutboxError(f"outbox.{destination}: {problem}")
        self._count += 1
        self._tx.execute(
            sql.statement("outbox_publish"),
            {
                "message_id": message_id,
                "tenant_id": ctx.tenant_id,
                "operation_id": ctx.operation_id,
                "fence": ctx.fence,
                "destination": destination,
                "body": data,
                "attributes": Jsonb(attrs),
                "ordering_key": ordering_key,
                "trace_context": trace_context,
            },
        )
        return message_id

    @property
    def published(self) -> int:
        """Messages this run has recorded so far."""
        return self._count


class NoOutbox:
    """``ctx.outbox`` outside a class A transaction: there is no transaction to publish in."""

    def publish(
        self,
        destination: str,
        body: bytes | str,
        *,
        attributes: Mapping[str, str] | None = None,
        ordering_key: str | None = None,
    ) -> str:
        raise OutboxError(
            "ctx.outbox publishes only inside a class A handler's handle(ctx, tx): the message "
            "must commit in the transaction of the business write"
        )


#: the one ``ctx.outbox`` of every context outside a class A transaction (it holds nothing)
NO_OUTBOX: Final = NoOutbox()


def _body(body: bytes | str) -> bytes:
    if isinstance(body, str):
        try:
            body = body.encode("utf-8")
        except UnicodeEncodeError:
            raise OutboxError("a message body of str must be encodable as UTF-8") from None
    if not isinstance(body, bytes | bytearray | memoryview):
        raise OutboxError(f"a message body is bytes or str, not {type(body).__name__}")
    data = bytes(body)
    if not data:
        raise OutboxError("a message body may not be empty (SQS and SNS refuse one)")
    return data


def _attributes(attributes: Mapping[str, str]) -> dict[str, str]:
    """The handler's attributes as strings, none of the relay's own (the destination's
    broker's rules are its :class:`MessageLimits`)."""
    checked: dict[str, str] = {}
    for name, value in attributes.items():
        if not isinstance(name, str) or not name:
            raise OutboxError(f"attribute name {name!r}: a name is a non-empty string")
        if name in RESERVED_ATTRIBUTES:
            raise OutboxError(f"attribute {name!r} is reserved")
        if not isinstance(value, str) or not value:
            raise OutboxError(f"attribute {name!r}: a value is a non-empty string")
        try:
            value.encode("utf-8")
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise OutboxError(f"attribute {name!r}: names and values are UTF-8 text") from None
        checked[name] = value
    return checked


def message_from_row(row: tuple[Any, ...]) -> OutboxMessage:
    """An ``outbox_pending`` row as a message."""
    message_id, tenant_id, operation_id, body, attributes, ordering_key, trace, attempts = row
    if isinstance(attributes, str):  # a driver without the jsonb loader
        attributes = json.loads(attributes)
    return OutboxMessage(
        message_id=message_id,
        tenant_id=tenant_id,
        operation_id=operation_id,
        body=bytes(body),
        attributes=dict(attributes or {}),
        ordering_key=ordering_key,
        trace_context=trace,
        attempts=int(attempts),
    )
