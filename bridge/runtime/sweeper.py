"""The sweeper: expired last attempts become ``unknown``, on a timer, one process at a time.

Each round runs one guarded statement (see ``bridge/sql/store/sweep.sql``) inside a transaction
that first takes a transaction-scoped advisory lock; a process that does not get the lock skips
the round. Rows whose lease expired with attempts left are not the sweeper's business: the
next claim takes them over. A class D row whose claim expired before it recorded its intent made
no call, so the same statement sends it back to the queue instead of parking it (a bounded
number of times: :data:`~bridge.store.work.UNSTARTED_CLAIMS_MAX`).

The rounds run as a supervised service: a round that fails, for whatever reason, is logged by
type, counted and retried with backoff, and the sweeper is unready meanwhile. It remembers
only the most recent rows it parked (``keep``), and a running total.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from bridge.service import Backoff, Deadline, Limits, Supervised
from bridge.store.settle import SettleStore
from bridge.types import Ticket

log = logging.getLogger(__name__)

SWEEP_INTERVAL_DEFAULT = 15.0
#: how many of the most recently parked rows a sweeper remembers
PARKED_KEPT_DEFAULT = 1000


class Sweeper:
    def __init__(
        self,
        store: SettleStore,
        *,
        interval: float = SWEEP_INTERVAL_DEFAULT,
        keep: int = PARKED_KEPT_DEFAULT,
        backoff: Backoff | None = None,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.parked: deque[Ticket] = deque(maxlen=keep)
        self.parked_total = 0
        #: class D rows sent back to the queue: their claims never started the call
        self.requeued_total = 0
        self.service = Supervised(
            "sweeper",
            self.sweep_once,
            every=interval,
            backoff=backoff or Backoff(cap=min(max(interval, 0.1), 60.0)),
            limits=limits,
            on_restart=on_restart,
        )

    def start(self) -> None:
        self.service.start()

    def stop(self, deadline: float | Deadline = 10.0) -> None:
        self.service.stop(deadline)

    def sweep_once(self) -> list[Ticket]:
        """One sweep; returns the rows it parked (those it queued again are counted)."""
        swept = self._store.sweep(exclusive=True)
        parked, requeued = swept.parked, swept.requeued
        if parked:
            log.warning("sweeper parked %d expired last attempt(s) as unknown", len(parked))
        if requeued:
            log.warning(
                "sweeper sent %d class D claim(s) that expired before their call back to the queue",
                len(requeued),
            )
        if parked or requeued:
            with self._lock:
                self.parked.extend(parked)
                self.parked_total += len(parked)
                self.requeued_total += len(requeued)
        return parked
