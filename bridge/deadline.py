"""The deadline of a class A transaction: past it, the transaction is cancelled, never committed.

A class A handler runs inside the transaction that holds its work row's lock, so nothing can
take the row over while it runs (claims and the sweeper skip locked rows): its lease cannot end
it. Its deadline does. When the deadline passes, :class:`TransactionDeadline` cancels the
statement the connection is running (a wait for a business-row lock, a long query) and marks
itself expired; the executor then rolls back instead of committing. The rollback means nothing
was applied, so the run is retried, never parked as ``unknown``.

A handler stuck outside the database (a call that hangs) cannot be interrupted from here; the
transaction's own bounds take over: the executor sets ``idle_in_transaction_session_timeout``
and ``statement_timeout`` to the deadline for that transaction, so the server ends a session
left idle that long and releases the row. Either way the row and the server's session are
freed within about twice the deadline at worst, and the work is never committed past it.

The cancel and the commit never cross: both take one lock, the commit decides first whether
the deadline passed, and once it has decided, the timer does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from types import TracebackType

from bridge.database import Connection
from bridge.errors import DeadlineExceeded

log = logging.getLogger(__name__)

#: the longest the cancel request may take before the timer gives up on it
CANCEL_TIMEOUT_SECONDS = 5.0


class TransactionDeadline:
    """Cancels one connection's transaction at its deadline unless it finished first.

    Use as a context manager around the work, and call :meth:`finish` just before COMMIT: it
    raises :class:`DeadlineExceeded` if the deadline has passed, so the transaction rolls back.
    """

    def __init__(self, conn: Connection, deadline: timedelta) -> None:
        self._conn = conn
        self.deadline = deadline
        self._lock = threading.Lock()
        self._expired = False
        self._finished = False
        self._timer = threading.Timer(deadline.total_seconds(), self._expire)
        self._timer.daemon = True
        self._timer.name = "fencebridge-deadline"
        #: monotonic time at which the transaction must be over
        self.at = time.monotonic() + deadline.total_seconds()

    @property
    def expired(self) -> bool:
        """The deadline passed before the work finished (it will not commit)."""
        with self._lock:
            return self._expired or (not self._finished and time.monotonic() >= self.at)

    def __enter__(self) -> TransactionDeadline:
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            if not self._finished:  # left early, by an exception: was it the deadline's?
                self._expired = self._expired or time.monotonic() >= self.at
                self._finished = True
        self._timer.cancel()

    def finish(self) -> None:
        """Decide, before COMMIT, that the work ended in time; else raise DeadlineExceeded."""
        with self._lock:
            late = self._expired or time.monotonic() >= self.at
            self._expired = late
            self._finished = True
        self._timer.cancel()
        if late:
            raise DeadlineExceeded(self.deadline)

    def _expire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._expired = True
            try:
                # Interrupts a statement in progress (a lock wait); a session idle in its
                # transaction ignores it, and the transaction's idle timeout ends it instead.
                self._conn.cancel_safe(timeout=CANCEL_TIMEOUT_SECONDS)
            except Exception as exc:  # noqa: BLE001  (the rollback still follows; say why)
                log.warning(
                    "cancelling a transaction past its deadline failed (%s)", type(exc).__name__
                )
