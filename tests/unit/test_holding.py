"""The Holder's scheduling, behind its two seams: a broker that records calls, a store of states.

The broker and the store here are stand-ins so the timing is the test's to decide; the real
brokers are exercised through the same Holder by the consumer tests (moto through a proxy with
real-AWS handle rules, Google's emulator with exactly-once delivery).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.adapters.holding import CallResult, Holder
from bridge.types import Key, State
from tests.support.waiting import eventually


@dataclass(frozen=True, slots=True)
class Copy:
    handle: str
    key: Key | None
    received_at: float


@dataclass
class Broker:
    """Records every call; a settle can be made slow, an ack refused for a while."""

    max_batch: int = 10
    settle_pause: float = 0.0
    #: handles whose acknowledgement is unconfirmed this many more times
    refuse: dict[str, int] = field(default_factory=dict)
    #: handles whose extension is refused for good
    lost: set[str] = field(default_factory=set)
    calls: list[tuple[str, float, tuple[str, ...]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, kind: str, held: Sequence[Copy]) -> None:
        with self._lock:
            self.calls.append((kind, time.monotonic(), tuple(h.handle for h in held)))

    def settle(self, held: Sequence[Copy]) -> CallResult[Copy]:
        self._record("settle", held)
        time.sleep(self.settle_pause)
        retry = []
        with self._lock:
            for h in held:
                if self.refuse.get(h.handle, 0) > 0:
                    self.refuse[h.handle] -= 1
                    retry.append(h)
        return CallResult(done=[h for h in held if h not in retry], retry=retry)

    def extend(self, held: Sequence[Copy], seconds: float) -> CallResult[Copy]:
        self._record("extend", held)
        return CallResult(
            done=[h for h in held if h.handle not in self.lost],
            lost=[h for h in held if h.handle in self.lost],
        )

    def release(self, held: Sequence[Copy]) -> None:
        self._record("release", held)

    def of(self, kind: str, handle: str) -> list[float]:
        with self._lock:
            return [t for k, t, handles in self.calls if k == kind and handle in handles]


class Rows:
    """What ``watch`` answers: state and whether the claim's lease is live, by key."""

    def __init__(self) -> None:
        self.rows: dict[Key, tuple[State, bool]] = {}

    def watch(self, keys: Sequence[Key]) -> dict[Key, tuple[State, bool]]:
        return {k: self.rows[k] for k in keys if k in self.rows}


@pytest.fixture
def rows() -> Rows:
    return Rows()


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def holder(rows: Rows, broker: Broker) -> Iterator[Holder[Copy]]:
    store: Any = rows
    held = Holder("test", store, broker, extension=1.0, limit=60.0, settle_interval=0.05)
    held.start()
    try:
        yield held
    finally:
        held.stop(2.0)


def copy(n: int, key: Key | None = None) -> Copy:
    return Copy(f"h{n}", key if key is not None else Key("t1", f"op-{n}"), time.monotonic())


@pytest.mark.slow
def test_each_copy_is_extended_from_its_own_deadline_earliest_first(
    holder: Holder[Copy], rows: Rows, broker: Broker
) -> None:
    late, early = copy(1), copy(2)
    rows.rows[late.key] = rows.rows[early.key] = (State.QUEUED, False)  # type: ignore[index]
    now = time.monotonic()
    holder.hold([late], deadline=now + 3.0)
    holder.hold([early], deadline=now + 1.0)
    eventually(lambda: bool(broker.of("extend", "h2")), "the early copy's extension", timeout=5)
    assert not broker.of("extend", "h1"), "the later deadline was extended first"
    eventually(lambda: bool(broker.of("extend", "h1")), "the later copy's extension", timeout=5)
    # Each is extended half an extension before its own deadline, not on a common period.
    assert broker.of("extend", "h1")[0] - broker.of("extend", "h2")[0] > 1.0


def test_copies_whose_deadlines_are_moments_apart_are_extended_in_one_call(
    holder: Holder[Copy], rows: Rows, broker: Broker
) -> None:
    copies = [copy(n) for n in range(10)]
    now = time.monotonic()
    for n, c in enumerate(copies):
        rows.rows[c.key] = (State.CLAIMED, True)  # type: ignore[index]
        # 20 ms apart: each would be due in its own round, and extended in its own call
        holder.hold([c], deadline=now + 1.0 + n * 0.02)
    eventually(lambda: bool(broker.of("extend", "h0")), "the first extension", timeout=5)
    first = next(handles for kind, _, handles in broker.calls if kind == "extend")
    assert sorted(first) == sorted(c.handle for c in copies)


def test_a_slow_acknowledgement_never_delays_another_copys_extension(
    holder: Holder[Copy], rows: Rows, broker: Broker
) -> None:
    broker.settle_pause = 3.0
    done, waiting = copy(1), copy(2)
    rows.rows[done.key] = (State.SUCCEEDED, False)  # type: ignore[index]
    rows.rows[waiting.key] = (State.CLAIMED, True)  # type: ignore[index]
    now = time.monotonic()
    holder.hold([done], deadline=now + 10.0)
    eventually(lambda: bool(broker.of("settle", "h1")), "the slow acknowledgement to start")
    holder.hold([waiting], deadline=time.monotonic() + 1.0)
    eventually(lambda: bool(broker.of("extend", "h2")), "the extension", timeout=2.5)
    # The extension went out while the acknowledgement was still in its call.
    assert broker.of("extend", "h2")[0] < broker.of("settle", "h1")[0] + broker.settle_pause


@pytest.mark.slow
def test_an_unconfirmed_acknowledgement_keeps_its_copy_held_and_extended(
    holder: Holder[Copy], rows: Rows, broker: Broker
) -> None:
    stubborn = copy(1)
    rows.rows[stubborn.key] = (State.SUCCEEDED, False)  # type: ignore[index]
    broker.refuse["h1"] = 1000  # refused until the test lets it through
    holder.hold([stubborn], deadline=time.monotonic() + 1.0)
    eventually(lambda: holder.counts["settle_retried"] >= 1, "the ack to be tried again")
    eventually(lambda: len(broker.of("extend", "h1")) >= 2, "the waiting copy to be extended")
    assert len(holder) == 1
    broker.refuse["h1"] = 0
    eventually(lambda: holder.counts["settled"] == 1, "the ack once the broker takes it")
    assert len(holder) == 0
    assert holder.counts["broker_lease_lost"] == 0


def test_a_copy_with_nothing_to_wait_for_is_acknowledged_at_once(
    holder: Holder[Copy], broker: Broker
) -> None:
    quarantined = Copy("h9", None, time.monotonic())
    holder.hold([quarantined], deadline=time.monotonic() + 30.0)
    eventually(lambda: holder.counts["settled"] == 1, "the acknowledgement")
    assert not broker.of("extend", "h9")


def test_a_stalled_claim_is_let_go_and_a_refused_extension_is_a_lost_lease(
    holder: Holder[Copy], rows: Rows, broker: Broker
) -> None:
    stalled, refused = copy(1), copy(2)
    rows.rows[stalled.key] = (State.CLAIMED, False)  # type: ignore[index]  # lease lapsed
    rows.rows[refused.key] = (State.QUEUED, False)  # type: ignore[index]
    broker.lost.add("h2")
    holder.hold([stalled, refused], deadline=time.monotonic() + 1.0)
    eventually(lambda: holder.counts["let_go"] == 1, "the stalled copy to be let go")
    eventually(lambda: holder.counts["broker_lease_lost"] == 1, "the refused extension")
    assert not broker.of("extend", "h1")
    assert len(holder) == 0


def test_stop_releases_every_copy_still_held(rows: Rows, broker: Broker) -> None:
    store: Any = rows
    holder = Holder("test", store, broker, extension=5.0, limit=60.0, settle_interval=0.05)
    holder.start()
    items = [copy(n) for n in range(25)]
    for item in items:
        rows.rows[item.key] = (State.QUEUED, False)  # type: ignore[index]
    holder.hold(items, deadline=time.monotonic() + 30.0)
    holder.stop(5.0)
    released = {h for kind, _, handles in broker.calls if kind == "release" for h in handles}
    assert released == {i.handle for i in items}
    assert holder.counts["released"] == 25


@dataclass(frozen=True, slots=True)
class KeyedCopy:
    handle: str
    key: Key | None
    received_at: float
    #: (ack group, place in its delivery order); None: no group
    place: tuple[str, int] | None


def keyed(n: int, group: str | None) -> KeyedCopy:
    place = (group, n) if group is not None else None
    return KeyedCopy(f"h{n}", Key("t1", f"op-{n}"), time.monotonic(), place)


@pytest.fixture
def ordered_holder(rows: Rows, broker: Broker) -> Iterator[Holder[KeyedCopy]]:
    store: Any = rows
    held = Holder(
        "test",
        store,
        broker,
        extension=1.0,
        limit=60.0,
        settle_interval=0.05,
        order=lambda c: c.place,
    )
    held.start()
    try:
        yield held
    finally:
        held.stop(2.0)


def test_a_later_copy_of_a_group_waits_for_the_earlier_ones_and_is_acked_after_them(
    ordered_holder: Holder[KeyedCopy], rows: Rows, broker: Broker
) -> None:
    """An ordering key's acks go out in delivery order; a copy of no group never waits."""
    first, second, third, free = keyed(1, "k"), keyed(2, "k"), keyed(3, "k"), keyed(4, None)
    rows.rows[first.key] = (State.CLAIMED, True)  # type: ignore[index]
    for c in (second, third, free):
        rows.rows[c.key] = (State.SUCCEEDED, False)  # type: ignore[index]
    # Held out of order (two writers), deadlines near: waiting copies must be extended.
    ordered_holder.hold([third, free], deadline=time.monotonic() + 1.0)
    ordered_holder.hold([second], deadline=time.monotonic() + 1.0)
    ordered_holder.hold([first], deadline=time.monotonic() + 1.0)
    eventually(lambda: bool(broker.of("settle", "h4")), "the ungrouped copy's ack")
    eventually(
        lambda: len(broker.of("extend", "h2")) >= 2 and len(broker.of("extend", "h3")) >= 2,
        "the waiting copies to be kept leased",
    )
    assert not broker.of("settle", "h2")
    assert not broker.of("settle", "h3")
    rows.rows[first.key] = (State.SUCCEEDED, False)  # type: ignore[index]
    eventually(lambda: ordered_holder.counts["settled"] == 4, "every ack")
    settles = [handles for kind, _, handles in broker.calls if kind == "settle" and "h1" in handles]
    assert settles == [("h1", "h2", "h3")], broker.calls
    assert ordered_holder.counts["broker_lease_lost"] == 0


def test_a_group_is_acked_only_up_to_its_first_copy_still_waiting(
    ordered_holder: Holder[KeyedCopy], rows: Rows, broker: Broker
) -> None:
    copies = [keyed(n, "k") for n in range(1, 5)]
    for c in copies:
        rows.rows[c.key] = (State.SUCCEEDED, False)  # type: ignore[index]
    rows.rows[copies[2].key] = (State.QUEUED, False)  # type: ignore[index]
    ordered_holder.hold(copies, deadline=time.monotonic() + 30.0)
    eventually(lambda: ordered_holder.counts["settled"] == 2, "the acks before the waiting copy")
    assert not broker.of("settle", "h4")
    rows.rows[copies[2].key] = (State.SUCCEEDED, False)  # type: ignore[index]
    eventually(lambda: ordered_holder.counts["settled"] == 4, "the rest, once it settled")
    order = [h for kind, _, handles in broker.calls if kind == "settle" for h in handles]
    assert order == ["h1", "h2", "h3", "h4"]
