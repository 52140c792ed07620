"""How the core finds broker adapters, and what it asks of them, without importing them.

Adapters live in the ``consumers`` package (or in a package of their own), which depends on
``bridge``; the core never depends on them. Each adapter module exposes one
:class:`SourceAdapter` and registers it under the ``fencebridge.sources`` entry-point group,
keyed by the ``source`` value a subscription names::

    [project.entry-points."fencebridge.sources"]
    sqs = "consumers.sqs.source:ADAPTER"

The core validates the keys every subscription has (source, ack mode, job types, decoding,
limits) and hands the rest of the subscription's table to the adapter's settings model, a
:class:`SourceSettings`: the adapter owns its keys, their checks and their documentation, and
the configuration reference and JSON Schema are built from them. A module is imported only
when a subscription names its source (or when the reference or the schema lists them all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from bridge.adapters.plugins import Plugins
from bridge.config.model import SourceSettings, SubscriptionConfig

if TYPE_CHECKING:
    from bridge.adapters.holding import RowWatch
    from bridge.ingest.inbox import Inbox
    from bridge.service import Service

__all__ = [
    "ENTRY_POINT_GROUP",
    "SOURCES",
    "AckProbe",
    "Consumer",
    "Factory",
    "ProbedAcks",
    "SourceAdapter",
    "SourceSettings",
    "adapter",
    "factory",
    "names",
    "shipped",
]

ENTRY_POINT_GROUP: Final = "fencebridge.sources"


class Consumer(Protocol):
    """**Protocol**: receives one subscription into the inbox and acknowledges after commit."""

    subscription: str

    def start(self) -> None: ...

    def stop(self, deadline: float = 30.0) -> None:
        """Stop receiving; deliveries already received are written and acknowledged."""

    def status(self) -> tuple[bool, str]:
        """Whether it is receiving, and if not, why (for ``/readyz`` and the log)."""
        ...

    def services(self) -> Sequence[Service]:
        """Its long-lived loops as supervised services (build them with
        :meth:`~bridge.ingest.inbox.Inbox.supervised`): ``/healthz`` fails when one is past the
        bridge's limits, and their restarts are counted in ``fencebridge.thread.restarts``."""
        ...


#: (subscription, inbox, rows) -> consumer; the subscription's ``settings`` are the adapter's,
#: and ``rows`` is what a holder of ``after_outcome`` deliveries watches
Factory = Callable[[SubscriptionConfig, "Inbox", "RowWatch"], Consumer]


@dataclass(frozen=True, slots=True)
class ProbedAcks:
    """What an adapter's broker stand-in recorded while one probe delivery went through."""

    #: acknowledgements the stand-in received (deletes, acks): none may follow a failed commit
    acks: int
    #: the broker call that acknowledges, as the evidence names it (``DeleteMessageBatch``)
    call: str
    #: the class of the error the consumer's write raised, None if the write returned
    raised: str | None = None


#: ``fencebridge check --probe`` (control 8): (subscription, inbox) -> what the stand-in recorded.
#: The adapter drives its own receive, write and acknowledge path for one delivery against an
#: in-process stand-in of its broker client, so the check can watch that nothing is
#: acknowledged when the inbox commit fails; it must not reach the real broker.
AckProbe = Callable[[SubscriptionConfig, "Inbox"], ProbedAcks]


@dataclass(frozen=True, slots=True)
class BrokerFinding:
    """One thing ``fencebridge check`` read from the broker about a subscription's queue or
    subscription: a setting that holds, one to look at (``warning``) or a no-go."""

    text: str
    go: bool = True
    warning: bool = False


@dataclass(frozen=True, slots=True)
class BrokerExpectations:
    """What the bridge's configuration expects of a subscription's queue or subscription."""

    #: the longest lease of the job types it delivers (seconds)
    lease_seconds: float
    #: the longest a delivery can be held (``after_outcome``): lease times attempts (seconds)
    hold_seconds: float
    #: how long tombstones are kept (``[retention] tombstone_days``), None without a plan
    tombstone_days: int | None


#: ``fencebridge check``: reads the subscription's queue or subscription (it must exist) and its
#: settings from the real broker, never receiving or acknowledging anything; raises
#: :class:`~bridge.errors.BrokerUnavailable` when the broker cannot be asked
BrokerInspection = Callable[[SubscriptionConfig, BrokerExpectations], list[BrokerFinding]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceAdapter:
    """What an adapter registers: its keys, its consumer, and the facts the core reports."""

    #: the adapter's keys of a subscription table
    settings: type[SourceSettings]
    #: builds the running consumer of one subscription
    open: Factory
    #: ``messaging.system`` of its spans and metrics (OpenTelemetry messaging conventions)
    messaging_system: str
    #: the longest the broker can hand a message over again, in days: a row purged sooner
    #: would run again on a redelivery (``fencebridge check`` compares the retention plan)
    redelivery_days: int
    #: control 8's executed evidence (``fencebridge check --probe``); without it the check
    #: answers no-go under ``--probe``, since nothing shows that it acks only after commit
    probe_ack_after_commit: AckProbe | None = None
    #: what ``fencebridge check`` reads of the subscription's queue or subscription; without
    #: it, the check says the broker was not probed
    inspect_broker: BrokerInspection | None = None


#: the installed sources, by the ``source`` value a subscription names
SOURCES: Final = Plugins(ENTRY_POINT_GROUP, SourceAdapter, "source")
#: every installed source, sorted; none is imported
names = SOURCES.names
#: the sources this distribution ships itself (what the published reference documents)
shipped = SOURCES.shipped
#: the installed adapter of ``source = kind``; imports its module on first use
adapter = SOURCES.get


def factory(kind: str) -> Factory:
    """The consumer factory of ``source = kind``."""
    return adapter(kind).open
