"""The adapter kit: everything a broker adapter takes from the core, in one import.

A source (a broker's consumer) or an outbox sink imports this module, :mod:`bridge.types` and
:mod:`bridge.errors`, and nothing else of ``bridge`` (``tests/unit/test_layout.py`` keeps the
rule). What it finds here:

* **its contract**: :class:`SourceAdapter` (its keys, its consumer's factory, the facts the core
  reports) or :class:`SinkAdapter`, and the :class:`Consumer` or :class:`Sink` it builds;
* **its keys**: :class:`SourceSettings` / :class:`SinkSettings` to declare them on, the
  field helpers of the configuration (:class:`Shown`, :func:`checked`, :data:`HttpUrl`), and
  the core's half of the table it is given (:class:`SubscriptionConfig`,
  :class:`DestinationConfig`);
* **the inbox** a consumer writes each received batch through (:class:`Inbox`: each delivery
  comes back :class:`Written`, or :class:`Deferred` when its tenant's backlog is at the quota),
  and for ``after_outcome`` the :class:`Holder` that keeps held copies at the broker until their
  rows settle, reading them through :class:`RowWatch`;
* **the lifecycle** its loops run under (:class:`Service`, :class:`Backoff`,
  :class:`Deadline`);
* **the trace context** a producer sent (:func:`producer_traceparent`), and for a sink the
  limits its broker sets on one message (:class:`MessageLimits`).

The one tie that runs back up is inherent: the configuration reader asks the registry for each
adapter's keys (its settings model), so :mod:`bridge.config` reaches the adapters' contracts,
while adapters receive the core's half of their table from it.
"""

from __future__ import annotations

from bridge.adapters.holding import (
    BrokerLeases,
    CallResult,
    Holder,
    RowWatch,
    confirm,
    stream_status,
)
from bridge.adapters.sinks import Refusal, Refused, Sink, SinkAdapter
from bridge.adapters.sources import (
    AckProbe,
    BrokerExpectations,
    BrokerFinding,
    Consumer,
    Factory,
    ProbedAcks,
    SourceAdapter,
)
from bridge.config.fields import HttpUrl, Name, Shown, Table, checked, shown
from bridge.config.model import (
    DestinationConfig,
    SinkSettings,
    SourceSettings,
    SubscriptionConfig,
)
from bridge.ingest.inbox import Deferred, Inbox, Written
from bridge.outbox.limits import LEAST_COMMON, MessageLimits
from bridge.outbox.publish import OutboxMessage
from bridge.service import IDLE, Backoff, Deadline, Service
from bridge.telemetry.propagation import producer_traceparent

__all__ = [
    "IDLE",
    "LEAST_COMMON",
    "AckProbe",
    "Backoff",
    "BrokerExpectations",
    "BrokerFinding",
    "BrokerLeases",
    "CallResult",
    "Consumer",
    "Deadline",
    "Deferred",
    "DestinationConfig",
    "Factory",
    "Holder",
    "HttpUrl",
    "Inbox",
    "MessageLimits",
    "Name",
    "OutboxMessage",
    "ProbedAcks",
    "Refusal",
    "Refused",
    "RowWatch",
    "Service",
    "Shown",
    "Sink",
    "SinkAdapter",
    "SinkSettings",
    "SourceAdapter",
    "SourceSettings",
    "SubscriptionConfig",
    "Table",
    "Written",
    "checked",
    "confirm",
    "producer_traceparent",
    "shown",
    "stream_status",
]
