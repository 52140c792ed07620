"""How the relay finds the sinks that send outbox messages, without importing them.

Sinks live in the ``consumers`` package (or a package of their own), which depends on
``bridge``; the core never depends on them. Each sink module exposes one :class:`SinkAdapter`
under the ``fencebridge.sinks`` entry-point group, keyed by the ``sink`` value a destination
names::

    [project.entry-points."fencebridge.sinks"]
    sqs = "consumers.sqs_sink:SINK"

What a sink promises (:class:`Sink`): it sends the messages it is given in their order, each with
its id and trace context as attributes (:meth:`~bridge.outbox.OutboxMessage.sent_attributes`);
it answers, per message, sent or refused; and once a message is refused, it sends no later
message of the same ordering key in that call (those are :attr:`Refusal.HELD`), so a key's
messages leave in the order they were written. A call that fails as a whole raises
:class:`SinkUnavailable` when nothing says it did not send: the relay sends again later, with
the same ids. A service that refuses a whole request for one message in it is the sink's to
answer per message (send the rest again in smaller requests), so that no one message the
service will not take holds its destination back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Final, Protocol

from bridge.config.model import DestinationConfig
from bridge.errors import ConfigError, TransientError
from bridge.outbox import OutboxMessage
from bridge.outbox_limits import LEAST_COMMON, MessageLimits

ENTRY_POINT_GROUP: Final = "fencebridge.sinks"


class SinkUnavailable(TransientError):  # noqa: N818  (a condition of the sink's service)
    """A send call failed as a whole (connection refused or cut, throttled, a 5xx): retried."""


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
    """What a sink module registers."""

    #: builds the sink of one destination (its name and table)
    open: Callable[[str, DestinationConfig], Sink]
    #: ``messaging.system`` of its spans (OpenTelemetry messaging conventions)
    messaging_system: str
    #: what its broker accepts of one message: ``ctx.outbox.publish`` checks a message to one
    #: of its destinations against them (a sink that declares none gets the narrowest)
    limits: MessageLimits = LEAST_COMMON


def _found() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def names() -> list[str]:
    """Every installed sink, sorted; none is imported."""
    return sorted(_found())


def adapter(kind: str) -> SinkAdapter:
    """The installed sink of ``sink = kind``; imports its module on first use."""
    found = _found()
    if kind not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise ConfigError(f"no sink {kind!r} (available: {known})")
    return _load(found[kind])


@cache
def _load(ep: EntryPoint) -> SinkAdapter:
    loaded = ep.load()
    if not isinstance(loaded, SinkAdapter):
        raise ConfigError(
            f"entry point {ep.name!r} of {ENTRY_POINT_GROUP} ({ep.value}) is not a SinkAdapter"
        )
    return loaded
