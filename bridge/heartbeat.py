"""Heartbeats that follow progress, not time.

A lease is renewed only when its handler called ``ctx.progress()`` since the last renewal. A
handler that is stuck (a dead connection, a loop that stopped advancing) stops renewing, its
lease lapses and another worker may take over; the fence keeps the stuck one's late writes out.
This is what lets a lease be tuned for recovery time without trading away safety.

Each in-flight claim also keeps a local *trust window*: the moment, by this process's monotonic
clock, after which its lease must be assumed gone (measured from before the claim or renewal
was sent, so it errs early). Past it, ``ctx.progress()`` raises ``LeaseLost`` and the handler
learns at its next step. The database still decides every write by the fence.

Class A claims are neither heartbeated nor given a trust window: their handler runs inside a
transaction that holds the work row's lock, nothing can take a locked row over, and what ends
such a run is its transaction's deadline (:mod:`bridge.deadline`), not its lease.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from bridge.events import WorkEvents
from bridge.handlers import Context
from bridge.service import Backoff, Deadline, Limits, Supervised
from bridge.store.work import WorkStore
from bridge.types import Claim, TargetClass, Ticket

HEARTBEAT_FRACTION = 3  # renew up to three times per lease


@dataclass
class InFlight:
    claim: Claim
    ctx: Context
    lease: timedelta
    #: monotonic time after which the lease must be assumed lost
    trust_until: float
    started: float = field(default_factory=time.monotonic)
    #: a renewal was refused; reported by the worker unless the run settled after all
    renewal_refused: bool = False


class Heartbeater:
    """Renews the leases of in-flight claims whose handlers reported progress."""

    def __init__(
        self,
        store: WorkStore,
        events: WorkEvents,
        *,
        interval: float,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self._interval = interval
        self._lock = threading.Lock()
        self._inflight: dict[Ticket, InFlight] = {}
        # A failed round is retried within one interval at most: trust windows keep running.
        self.service = Supervised(
            "heartbeater",
            self.beat,
            every=interval,
            backoff=Backoff(initial=min(0.1, interval), cap=interval, sleep=sleep),
            limits=limits,
            on_restart=on_restart,
            stall_after=max(interval * HEARTBEAT_FRACTION, 1.0),
            thread_name="fencebridge-heartbeat",
        )

    @staticmethod
    def interval_for(leases: list[timedelta]) -> float:
        shortest = min(leases, default=timedelta(seconds=60)).total_seconds()
        return max(shortest / HEARTBEAT_FRACTION, 0.05)

    def start(self) -> None:
        self.service.start()

    def stop(self, deadline: float | Deadline = 5.0) -> None:
        self.service.stop(deadline)

    def track(self, claim: Claim, ctx: Context, lease: timedelta, sent_at: float) -> InFlight:
        entry = InFlight(claim, ctx, lease, sent_at + lease.total_seconds())
        with self._lock:
            self._inflight[claim.ticket] = entry
        return entry

    def untrack(self, claim: Claim) -> None:
        with self._lock:
            self._inflight.pop(claim.ticket, None)

    def inflight(self) -> list[InFlight]:
        with self._lock:
            return list(self._inflight.values())

    def beat(self) -> None:
        """One round: expire trust windows, renew the leases that made progress."""
        now = time.monotonic()
        due: dict[timedelta, list[InFlight]] = defaultdict(list)
        for entry in self.inflight():
            if entry.claim.target_class is TargetClass.A:
                # Not renewed and never expired: its row is locked in its own transaction,
                # which its deadline ends (bridge.deadline), not its lease.
                continue
            if entry.ctx.lease_lost.is_set():
                continue
            if now >= entry.trust_until:
                entry.ctx.lease_lost.set()
                continue
            if entry.ctx.take_progress():
                due[entry.lease].append(entry)
        failure: Exception | None = None
        for lease, entries in due.items():
            # Key order, as the completer settles: multi-row writes lock rows in one order.
            entries.sort(key=lambda e: (e.claim.tenant_id, e.claim.operation_id))
            sent_at = time.monotonic()
            try:
                lost = set(self._store.heartbeat_many([e.claim.ticket for e in entries], lease))
            except Exception as exc:  # noqa: BLE001  (any error: raised once the round is done)
                # Not renewed; trust windows keep running. Progress is re-armed so the next
                # round tries again; the supervisor logs, counts and retries it.
                for e in entries:
                    e.ctx.restore_progress()
                failure = failure or exc
                continue
            for e in entries:
                if e.claim.ticket in lost:
                    # Either a newer claim owns the row, or this run settled it a moment ago;
                    # the worker tells the two apart when the run ends and reports only the first.
                    e.ctx.lease_lost.set()
                    e.renewal_refused = True
                else:
                    e.trust_until = sent_at + lease.total_seconds()
        if failure is not None:
            raise failure
