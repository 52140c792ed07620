"""Plugins found by entry point: broker sources, outbox sinks, commands from outside the core.

One registry serves every group, so a source, a sink and a command are found, loaded and
refused the same way. The core never imports a plugin's module until something names it (a
subscription's ``source``, a destination's ``sink``, the command asked for), and an installed
package can add one without an edit to the core::

    [project.entry-points."fencebridge.sources"]
    sqs = "consumers.sqs.source:ADAPTER"

When two installed distributions register the same name, the first on ``sys.path`` wins, as
for imports.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Final, Generic, TypeVar

from bridge.errors import ConfigError

#: the distribution whose plugins the published reference documents
DISTRIBUTION: Final = "fencebridge"

T = TypeVar("T")


class Plugins(Generic[T]):
    """The plugins of one entry-point group, each an instance of ``kind``."""

    def __init__(self, group: str, kind: type[T], noun: str) -> None:
        #: the entry-point group, ``fencebridge.<plural>``
        self.group = group
        self._kind = kind
        #: what one is called in messages ("source", "sink")
        self._noun = noun

    def found(self) -> dict[str, EntryPoint]:
        """Every installed plugin by name; none is imported."""
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=self.group):
            found.setdefault(ep.name, ep)
        return found

    def names(self) -> list[str]:
        """Every installed plugin's name, sorted; none is imported."""
        return sorted(self.found())

    def shipped(self) -> list[str]:
        """The plugins this distribution ships itself (what the published reference
        documents), sorted."""
        return sorted(
            name
            for name, ep in self.found().items()
            if ep.dist is not None and ep.dist.metadata["Name"] == DISTRIBUTION
        )

    def get(self, name: str) -> T:
        """The installed plugin ``name``; its module is imported on first use."""
        found = self.found()
        if name not in found:
            known = ", ".join(sorted(found)) or "none installed"
            raise ConfigError(f"no {self._noun} {name!r} is installed (available: {known})")
        loaded = _load(found[name])
        if not isinstance(loaded, self._kind):
            ep = found[name]
            raise ConfigError(
                f"entry point {ep.name!r} of {self.group} ({ep.value}) is not a "
                f"{self._kind.__name__}"
            )
        return loaded


@cache
def _load(ep: EntryPoint) -> object:
    return ep.load()
