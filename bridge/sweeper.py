"""The sweeper: expired last attempts become ``unknown``, on a timer, one process at a time.

Each round runs one guarded statement (see ``bridge/sql/store/sweep.sql``) inside a transaction
that first takes a transaction-scoped advisory lock; a process that does not get the lock skips
the round. Rows whose lease expired with attempts left are not the sweeper's business: the
next claim takes them over.
"""

from __future__ import annotations

import logging
import threading

from bridge.errors import FenceBridgeError
from bridge.store import PostgresStore
from bridge.types import Ticket

log = logging.getLogger(__name__)

SWEEP_INTERVAL_DEFAULT = 15.0


class Sweeper:
    def __init__(self, store: PostgresStore, *, interval: float = SWEEP_INTERVAL_DEFAULT) -> None:
        self._store = store
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fencebridge-sweeper", daemon=True)
        self.parked: list[Ticket] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def sweep_once(self) -> list[Ticket]:
        parked = self._store.sweep(exclusive=True)
        if parked:
            log.warning("sweeper parked %d expired last attempt(s) as unknown", len(parked))
            self.parked.extend(parked)
        return parked

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep_once()
            except FenceBridgeError as exc:
                log.warning("sweep skipped: %s", exc)
