"""The collector's settings for ``fencebridge run``'s process (bridge.runtime.collector)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bridge.runtime.collector import YOUNG_THRESHOLD, settle_in


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def restored() -> Iterator[None]:
    """The test process's collector as it was, whatever the test did to it."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored")
def test_settling_in_collects_the_starts_garbage_then_freezes_what_lives_on() -> None:
    started = cycle()  # garbage the start left behind
    kept = [Node() for _ in range(10)]  # what the start made and the process keeps
    _, middle, old = gc.get_threshold()

    settle_in()

    assert started() is None, "the start's garbage was collected, not frozen"
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)


@pytest.mark.usefixtures("restored")
def test_a_cycle_made_after_settling_in_is_still_collected() -> None:
    settle_in()
    later = cycle()
    gc.collect()
    assert later() is None
