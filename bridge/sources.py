"""How the core finds broker adapters without importing them.

Adapters live in the ``consumers`` package, which depends on ``bridge``; the core must not
depend on them. Each adapter registers a factory under the ``fencebridge.sources`` entry-point
group (see ``pyproject.toml``), keyed by the ``source`` value of a subscription, and the
runtime looks it up by name when it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from bridge.errors import ConfigError

if TYPE_CHECKING:
    from bridge.inbox import Inbox
    from bridge.service import Service
    from bridge.store.work import WorkStore

ENTRY_POINT_GROUP = "fencebridge.sources"


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
        :meth:`~bridge.inbox.Inbox.supervised`): ``/healthz`` fails when one is past the
        bridge's limits, and their restarts are counted in ``fencebridge.thread.restarts``."""
        ...


#: (subscription config, inbox, store) -> consumer; the config object is the adapter's to read.
Factory = Callable[[Any, "Inbox", "WorkStore"], Consumer]


def factory(kind: str) -> Factory:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if kind not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise ConfigError(f"no consumer for source {kind!r} (available: {known})")
    loaded: Factory = found[kind].load()
    return loaded
