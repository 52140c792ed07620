"""A retention plan set against the brokers' redelivery windows: one rule, for ``check`` and
``purge``.

A work row purged while a broker can still hand its message over again turns that redelivery
into a new operation, and its effect runs a second time; an erased operation's tombstone
dropped as soon makes the redelivery of an erased operation new work. Each source adapter
states the longest its broker can redeliver (:attr:`bridge.adapters.sources.SourceAdapter.
redelivery_days`). ``fencebridge check`` reports a plan inside a window as no-go (control 9);
``fencebridge purge`` refuses to run with one unless forced. Both call :func:`within_redelivery`,
so they cannot disagree on the rule or its wording.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from bridge.adapters import sources

#: (who receives, source): a subscription's name, or a phrase naming every subscription of a
#: source when no configuration names them
Stream = tuple[str, str]


def within_redelivery(
    purge_after: timedelta, tombstones_kept: timedelta, streams: Iterable[Stream]
) -> list[str]:
    """One sentence per horizon that is not longer than a stream's redelivery window (each
    names the horizon, the stream and its window); empty when the plan clears them all."""
    problems = []
    for name, source in streams:
        days = sources.adapter(source).redelivery_days
        window = timedelta(days=days)
        if purge_after <= window:
            problems.append(
                f"purge after {span(purge_after)} is within {name}'s redelivery window "
                f"({source}: up to {days} d): a redelivery would run it again"
            )
        if tombstones_kept <= window:
            problems.append(
                f"tombstones kept {span(tombstones_kept)}, within {name}'s redelivery window "
                f"({source}: up to {days} d): a redelivery of an erased operation would run it "
                "again"
            )
    return problems


def every_installed_source() -> list[Stream]:
    """The streams to compare with when no configuration names the subscriptions: every
    subscription of every installed source, since any of them may be the one in use."""
    return [(f"a {name} subscription", name) for name in sources.names()]


def span(age: timedelta) -> str:
    """An age as the rule's sentences write it: ``30 d``, ``36 h`` or ``90 m``."""
    minutes = int(age.total_seconds()) // 60
    if minutes % (24 * 60) == 0:
        return f"{minutes // (24 * 60)} d"
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} m"
