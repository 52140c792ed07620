"""What the worker tier reports as it goes: the seam for counters, metrics, spans and logs.

Executors and the runtime call a :class:`WorkEvents`; they never talk to a telemetry backend
directly. :class:`EventCounter` keeps plain counts (tests, the demo's summary, health).
"""

from __future__ import annotations

import threading
from collections import Counter
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


class EventCounter:
    """Thread-safe counts of every event, keyed by a short name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def _add(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def claimed(self, claim: Claim) -> None:
        self._add("claimed")
        if claim.takeover:
            self._add("takeover")

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self._add(f"settled.{state.value}")

    def lease_lost(self, claim: Claim, action: str) -> None:
        self._add("lease_lost")

    def fenced_out(self, claim: Claim) -> None:
        self._add("fenced_out")

    def reconciled(self, claim: Claim, finding: str) -> None:
        self._add(f"reconciled.{finding}")

    def settle_unknown(self, claim: Claim, action: str) -> None:
        self._add("settle_unknown")


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
