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

A handler that never returns keeps its worker thread whatever becomes of its row: the lease
lapses and the row is taken over, but the thread is lost to the pool. A run still on its thread
more than one lease past its lease (past its trust window, or a class A run past its deadline
where that is longer than its lease) is *stuck*: it is logged once, and :class:`StuckRuns`
makes ``/readyz`` fail naming it, and ``/healthz`` once every worker thread is stuck, so that
the orchestrator restarts a process that can no longer run anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from bridge.events import WorkEvents
from bridge.handlers import Context
from bridge.service import Backoff, Deadline, Limits, Service, ServiceStatus, Supervised
from bridge.store.settle import SettleStore
from bridge.types import Claim, TargetClass, Ticket

log = logging.getLogger(__name__)

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
    #: seconds past ``trust_until`` after which a run still on its thread is stuck: one lease,
    #: or for class A its deadline where that is longer (its deadline, not its lease, ends it)
    grace: float = 0.0
    #: the handler still holds its worker thread (false once it returned, while the run's
    #: settlement is being written)
    running: bool = True
    #: logged as stuck already
    stuck_logged: bool = False

    @property
    def stuck_at(self) -> float:
        """Monotonic time from which the run, if still on its thread, is stuck."""
        return self.trust_until + self.grace


class Heartbeater:
    """Renews the leases of in-flight claims whose handlers reported progress."""

    def __init__(
        self,
        store: SettleStore,
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

    def track(
        self,
        claim: Claim,
        ctx: Context,
        lease: timedelta,
        sent_at: float,
        *,
        bound: timedelta | None = None,
    ) -> InFlight:
        """Follow a run from its claim (``sent_at``, monotonic, before the claim was sent);
        ``bound``: how long the run may take where that is longer than its lease (a class A
        deadline): it counts as stuck one lease after whichever ends later."""
        seconds = lease.total_seconds()
        extra = max((bound or lease).total_seconds() - seconds, 0.0)
        entry = InFlight(claim, ctx, lease, sent_at + seconds, grace=seconds + extra)
        with self._lock:
            self._inflight[claim.ticket] = entry
        return entry

    def untrack(self, claim: Claim) -> None:
        with self._lock:
            self._inflight.pop(claim.ticket, None)

    def inflight(self) -> list[InFlight]:
        with self._lock:
            return list(self._inflight.values())

    def stuck(self, now: float | None = None) -> list[InFlight]:
        """Runs still on their worker threads more than one lease past their lease."""
        at = time.monotonic() if now is None else now
        return [e for e in self.inflight() if e.running and at >= e.stuck_at]

    def _log_stuck(self, now: float) -> None:
        """Each run that became stuck, once, by job type (never its tenant or operation)."""
        for entry in self.stuck(now):
            if not entry.stuck_logged:
                entry.stuck_logged = True
                log.error(
                    "a handler of job type %s has held its worker thread %.0fs, more than one "
                    "lease past its lease; /readyz reports it until it returns",
                    entry.claim.job_type,
                    now - entry.started,
                )

    def beat(self) -> None:
        """One round: expire trust windows, renew the leases that made progress, log runs
        that became stuck."""
        now = time.monotonic()
        self._log_stuck(now)
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


class StuckRuns(Service):
    """The pool's stuck runs as a status for the probes (it runs no thread of its own).

    Not ready while any worker thread is held by a stuck run (see the module's docstring),
    naming how many and the job type of the longest; not live once every worker thread is:
    such a process claims nothing more, and only a restart gives it its threads back (its rows
    are taken over elsewhere once their leases lapse). A handler that reports progress keeps
    its lease, and is never stuck however long it runs.
    """

    name = "handlers"

    def __init__(
        self, heartbeater: Heartbeater, threads: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._heartbeater = heartbeater
        self._threads = threads
        self._clock = clock

    def start(self) -> None:
        """Nothing to start: the status is read from the runs the heartbeater follows."""

    def signal_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: Deadline) -> bool:
        return True

    def status(self) -> ServiceStatus:
        now = self._clock()
        stuck = self._heartbeater.stuck(now)
        if not stuck:
            return ServiceStatus(self.name, True, True, "ok")
        longest = min(stuck, key=lambda e: e.stuck_at)
        reason = (
            f"{len(stuck)} of {self._threads} worker thread(s) held by a handler more than one "
            f"lease past its lease; the longest: job type {longest.claim.job_type}, running for "
            f"{now - longest.started:.0f}s"
        )
        return ServiceStatus(self.name, False, len(stuck) < self._threads, reason)
