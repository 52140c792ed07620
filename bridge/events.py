"""What the worker tier reports as it goes: the seam for counters, metrics, spans and logs.

Executors and the runtime call a :class:`WorkEvents`; they never talk to a telemetry backend
directly. :class:`EventCounter` keeps plain counts (tests, the demo's summary, health).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Protocol

from bridge.types import Claim, State


class WorkEvents(Protocol):
    """**Protocol**: notified of every decision the worker tier makes about a claim."""

    def claimed(self, claim: Claim) -> None: ...
    def settled(self, claim: Claim, state: State, code: str) -> None: ...
    def lease_lost(self, claim: Claim, action: str) -> None: ...
    def fenced_out(self, claim: Claim) -> None: ...
    def reconciled(self, claim: Claim, finding: str) -> None: ...
    def settle_unknown(self, claim: Claim, action: str) -> None: ...
    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None: ...


class EventCounter:
    """Thread-safe counts of every event, keyed by a short name.

    Each thread counts into its own :class:`~collections.Counter` (no lock on the way: one is
    taken per job otherwise, and sixteen workers queue on it); a read adds them up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._all: list[Counter[str]] = []

    def _mine(self) -> Counter[str]:
        mine: Counter[str] | None = getattr(self._local, "counts", None)
        if mine is None:
            mine = self._local.counts = Counter()
            with self._lock:
                self._all.append(mine)
        return mine

    def _add(self, name: str) -> None:
        self._mine()[name] += 1

    def _total(self) -> Counter[str]:
        with self._lock:
            counters = list(self._all)
        total: Counter[str] = Counter()
        for counts in counters:
            total.update(dict(counts))  # a copy: its thread may be counting meanwhile
        return total

    def __getitem__(self, name: str) -> int:
        return self._total()[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self._total())

    def claimed(self, claim: Claim) -> None:
        self._add("claimed")
        if claim.takeover:
            self._add("takeover")

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self._add(_SETTLED[state])

    def lease_lost(self, claim: Claim, action: str) -> None:
        self._add("lease_lost")

    def fenced_out(self, claim: Claim) -> None:
        self._add("fenced_out")

    def reconciled(self, claim: Claim, finding: str) -> None:
        self._add(f"reconciled.{finding}")

    def settle_unknown(self, claim: Claim, action: str) -> None:
        self._add("settle_unknown")

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        self._add("rate_wait_clamped")


#: the count of each settled state, named once
_SETTLED = {state: f"settled.{state.value}" for state in State}


class FanOut:
    """Sends every event to several receivers (counts and telemetry, say)."""

    def __init__(self, *receivers: WorkEvents) -> None:
        self._receivers = receivers

    def claimed(self, claim: Claim) -> None:
        for r in self._receivers:
            r.claimed(claim)

    def settled(self, claim: Claim, state: State, code: str) -> None:
        for r in self._receivers:
            r.settled(claim, state, code)

    def lease_lost(self, claim: Claim, action: str) -> None:
        for r in self._receivers:
            r.lease_lost(claim, action)

    def fenced_out(self, claim: Claim) -> None:
        for r in self._receivers:
            r.fenced_out(claim)

    def reconciled(self, claim: Claim, finding: str) -> None:
        for r in self._receivers:
            r.reconciled(claim, finding)

    def settle_unknown(self, claim: Claim, action: str) -> None:
        for r in self._receivers:
            r.settle_unknown(claim, action)

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        for r in self._receivers:
            r.rate_wait_clamped(claim, asked)
