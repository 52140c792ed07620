"""Failed sign-ins are limited and logged: a token cannot be guessed at thousands a second.

Each peer address may fail :data:`FAILURES_MAX` times within :data:`WINDOW_SECONDS`; the next
attempt is refused (429, with ``Retry-After``) until :data:`LOCKOUT_SECONDS` have passed, right
token or not. All peers together may fail :data:`OVERALL_MAX` times a window, so many addresses
do not add up to a fast guess either. A success clears the peer's count. Every refusal and
every success is logged (peer address, and the principal's name on success; never a token).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

log = logging.getLogger("bridge.console.auth")

FAILURES_MAX = 5
WINDOW_SECONDS = 60.0
LOCKOUT_SECONDS = 300.0
OVERALL_MAX = 60
#: peers remembered; the quietest are forgotten first
PEERS_MAX = 10_000


class Throttle:
    """Sign-in failures by peer and overall; safe to use from any thread."""

    def __init__(
        self,
        *,
        failures: int = FAILURES_MAX,
        window: float = WINDOW_SECONDS,
        lockout: float = LOCKOUT_SECONDS,
        overall: int = OVERALL_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = failures
        self._window = window
        self._lockout = lockout
        self._overall = overall
        self._clock = clock
        self._lock = threading.Lock()
        self._by_peer: OrderedDict[str, deque[float]] = OrderedDict()
        self._locked: dict[str, float] = {}
        self._all: deque[float] = deque()

    def wait(self, peer: str) -> float:
        """Seconds until ``peer`` may try again; 0 when it may now."""
        now = self._clock()
        with self._lock:
            until = self._locked.get(peer, 0.0)
            if until > now:
                return until - now
            self._locked.pop(peer, None)
            while self._all and self._all[0] <= now - self._window:
                self._all.popleft()
            if len(self._all) >= self._overall:
                return self._all[0] + self._window - now
        return 0.0

    def failed(self, peer: str, where: str) -> None:
        now = self._clock()
        with self._lock:
            self._all.append(now)
            times = self._by_peer.setdefault(peer, deque())
            self._by_peer.move_to_end(peer)
            times.append(now)
            while times and times[0] <= now - self._window:
                times.popleft()
            if len(times) >= self._failures:
                self._locked[peer] = now + self._lockout
                times.clear()
                log.warning("console %s: %s locked out after failed sign-ins", where, peer)
            while len(self._by_peer) > PEERS_MAX:
                self._by_peer.popitem(last=False)
        log.warning("console %s: sign-in refused from %s", where, peer)

    def succeeded(self, peer: str, where: str, name: str, role: str) -> None:
        with self._lock:
            self._by_peer.pop(peer, None)
        log.info("console %s: %s (%s) signed in from %s", where, name, role, peer)


class RateCap:
    """At most ``per_minute`` units (rows redriven) in any minute, across the console."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._taken: deque[tuple[float, int]] = deque()

    @property
    def per_minute(self) -> int:
        return self._per_minute

    def take(self, units: int) -> bool:
        """Whether ``units`` fit in the last minute's budget; taken if they do."""
        now = self._clock()
        with self._lock:
            while self._taken and self._taken[0][0] <= now - 60.0:
                self._taken.popleft()
            used = sum(n for _, n in self._taken)
            if used + units > self._per_minute:
                return False
            self._taken.append((now, units))
        return True
