"""How the relay finds the sinks that send outbox messages, without importing them.

Sinks live in the ``consumers`` package (or a package of their own), which depends on
``bridge``; the core never depends on them. Each sink module exposes one :class:`SinkAdapter`
under the ``fencebridge.sinks`` entry-point group (found as sources are:
:mod:`bridge.adapters.plugins`), keyed by the ``sink`` value a destination names::

    [project.entry-points."fencebridge.sinks"]
    sqs = "consumers.sqs.sink:SINK"

As a source does, a sink owns its keys of a destination's table (a :class:`SinkSettings`: its
address's form, its service's region or endpoint): the core validates the keys every
destination has, the sink's settings model the rest, and the configuration reference and JSON
Schema are built from both.

What a sink promises (:class:`Sink`): it sends the messages it is given in their order, each with
its id and trace context as attributes
(:meth:`~bridge.outbox.publish.OutboxMessage.sent_attributes`); it answers, per message, sent or
refused; and once a message is refused, it sends no later message of the same ordering key in that
call (those are :attr:`Refusal.HELD`), so a key's messages leave in the order they were written. A
call that fails as a whole raises :class:`SinkUnavailable` when nothing says it did not send: the
relay sends again later, with the same ids. A service that refuses a whole request for one message
in it is the sink's to answer per message (send the rest again in smaller requests), so that no one
message the service will not take holds its destination back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from bridge.adapters.plugins import Plugins
from bridge.config.model import DestinationConfig, SinkSettings
from bridge.outbox.limits import LEAST_COMMON, MessageLimits
from bridge.outbox.publish import OutboxMessage

ENTRY_POINT_GROUP: Final = "fencebridge.sinks"


class Refusal(enum.StrEnum):
    """Why one message of a call was not sent."""

    #: the service refused it for now (throttled, an internal error): counted, sent again
    RETRY = "retry"
    #: the service refused it as it is (too large, invalid attributes): parked at once
    INVALID = "invalid"
    #: not tried: an earlier message of its ordering key was refused in this call
    HELD = "held"


@dataclass(frozen=True, slots=True)
class Refused:
    kind: Refusal
    #: a short reason: the service's error code, never the message's content
    reason: str


class Sink(Protocol):
    """**Protocol**: sends one destination's messages."""

    def send(self, messages: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        """Send in order; the refused messages by id (every other one was sent)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkAdapter:
    """What a sink module registers: its keys, its sink, and the facts the core checks."""

    #: builds the sink of one destination (its name and table; the table's
    #: :attr:`~bridge.config.model.DestinationConfig.settings` are an instance of ``settings``)
    open: Callable[[str, DestinationConfig], Sink]
    #: the sink's keys of a destination table, beside the core's (none unless it declares them)
    settings: type[SinkSettings] = SinkSettings
    #: ``messaging.system`` of its spans (OpenTelemetry messaging conventions)
    messaging_system: str
    #: what its broker accepts of one message: ``ctx.outbox.publish`` checks a message to one
    #: of its destinations against them (a sink that declares none gets the narrowest)
    limits: MessageLimits = LEAST_COMMON


#: the installed sinks, by the ``sink`` value a destination names
SINKS: Final = Plugins(ENTRY_POINT_GROUP, SinkAdapter, "sink")
#: every installed sink, sorted; none is imported
names = SINKS.names
#: the sinks this distribution ships itself (what the published reference documents)
shipped = SINKS.shipped
#: the installed sink of ``sink = kind``; imports its module on first use
adapter = SINKS.get
