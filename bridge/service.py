"""One lifecycle for every long-lived thread of the bridge, and the supervisor that keeps it up.

A :class:`Service` starts, stops by a :class:`Deadline` and reports a :class:`ServiceStatus`.
:class:`Supervised` is the service every loop of the core runs as (claimer, workers,
heartbeater, sweeper, gauges, health endpoint): it calls a loop *body* over and over on its own
thread until told to stop, and an exception out of the body never ends the thread. The
supervisor logs it by type and where it was raised (never its text, which may quote a
payload; fencebridge's own errors, whose messages carry no identifiers, are logged with their
message), counts it through ``on_restart`` (the ``fencebridge.thread.restarts`` metric), waits
with tenacity's exponential backoff with full jitter, capped (:class:`Backoff`), and runs the
body again. While it fails, the service is not ready, with the reason; past
:class:`Limits` it is not live either. A dependency that cannot be reached
(:class:`~bridge.errors.TransientError`) keeps a service unready for as long as it lasts but never
makes it unlive: restarting the process would not bring the database back.

Using it for a loop of one's own::

    stop = threading.Event()
    loop = Supervised("receiver", receive_once, stop=stop, on_restart=telemetry.thread_restarted)
    loop.start()            # or loop.run() as the target of a thread one owns
    ...
    ok, why = loop.status().readiness   # for a consumer's status()
    loop.stop(Deadline(10))

``body`` does one round of work and returns; ``every`` is the pause between rounds (waited on
the stop event, so a stop cuts it short). A round that found nothing to do may return
:data:`IDLE`: it ends a run of failures only once ``idle_clears_after`` seconds have passed
since the last failure (a receive loop whose writes fail polls an empty queue in between,
while the failed messages are invisible: those polls prove nothing). Setting ``stop`` from
inside the body ends the loop after that round. The wait after a failure is also on the stop
event unless ``Backoff.sleep`` is given (tests inject one that does not sleep).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import tenacity

from bridge.errors import FenceBridgeError, TransientError

log = logging.getLogger(__name__)

Clock = Callable[[], float]

BACKOFF_INITIAL_DEFAULT = 0.1
BACKOFF_CAP_DEFAULT = 5.0
#: a service failing this long without one good round makes ``/healthz`` fail
UNHEALTHY_AFTER_SECONDS_DEFAULT = 300.0
#: ... or after this many restarts in a row
UNHEALTHY_AFTER_RESTARTS_DEFAULT = 50
#: what the parts already started get to stop when a later one fails to start
STOP_AFTER_FAILED_START_SECONDS = 10.0


class Deadline:
    """One moment by the monotonic clock that every step of a shutdown shares."""

    def __init__(self, seconds: float, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.end = clock() + max(seconds, 0.0)

    def remaining(self) -> float:
        return max(self.end - self._clock(), 0.0)

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    @classmethod
    def of(cls, deadline: float | Deadline) -> Deadline:
        """A deadline as given, or one that many seconds from now."""
        return deadline if isinstance(deadline, Deadline) else cls(deadline)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a supervised loop waits before its next try: tenacity's full-jitter exponential.

    The window doubles from ``initial`` and is capped at ``cap``; the wait is drawn uniformly
    from it, so replicas that failed together do not come back in lock-step. The exponent never
    overflows, however long the outage. ``sleep`` replaces the wait on the stop event.
    """

    initial: float = BACKOFF_INITIAL_DEFAULT
    cap: float = BACKOFF_CAP_DEFAULT
    sleep: Callable[[float], object] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ValueError("backoff needs 0 < initial <= cap")

    def wait(self) -> tenacity.wait.wait_base:
        return tenacity.wait_random_exponential(multiplier=self.initial, max=self.cap)


@dataclass(frozen=True, slots=True)
class Limits:
    """When a failing service stops being live (``/healthz``), not only unready."""

    failing_seconds: float = UNHEALTHY_AFTER_SECONDS_DEFAULT
    restarts: int = UNHEALTHY_AFTER_RESTARTS_DEFAULT


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    name: str
    ready: bool
    live: bool
    #: ``"ok"``, or why not ready; names the service and an error type, never an identifier
    reason: str
    #: restarts since start
    restarts: int = 0
    #: restarts since the last good round
    failures: int = 0

    @property
    def readiness(self) -> tuple[bool, str]:
        return self.ready, self.reason


class Service(ABC):
    """A named long-lived part of the bridge: start, stop by a deadline, status."""

    name: str

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def signal_stop(self) -> None:
        """Ask it to stop; returns at once."""

    @abstractmethod
    def join(self, deadline: Deadline) -> bool:
        """Wait until it has stopped or the deadline passed; whether it stopped."""

    def stop(self, deadline: float | Deadline = 10.0) -> bool:
        self.signal_stop()
        return self.join(Deadline.of(deadline))

    @abstractmethod
    def status(self) -> ServiceStatus: ...


def describe(exc: BaseException) -> str:
    """An exception as a log line or a probe may show it: its type, and where it came from.

    fencebridge's own errors add their message (written to carry no identifier or payload); a
    driver error under them adds its SQLSTATE. Any other exception's text stays out.
    """
    kind = type(exc).__name__
    if isinstance(exc, FenceBridgeError):
        text = f"{kind}: {exc}"
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
        if sqlstate and sqlstate not in text:
            text += f" (SQLSTATE {sqlstate})"
        return text
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        return f"{kind} at {Path(last.filename).name}:{last.lineno} in {last.name}"
    return kind


#: what a supervised body returns for a round that found nothing to do
IDLE: Final = "idle"


class Supervised(Service):
    """A loop body run over and over on its own thread; any exception restarts it, never ends it.

    ``name`` keys the service in ``/readyz``; ``label`` (default: ``name``) is the only label of
    its restart count, shared by identical loops (every worker counts as ``worker``).
    ``stall_after`` makes the service unready while one round has run longer than that.
    """

    def __init__(
        self,
        name: str,
        body: Callable[[], object],
        *,
        every: float = 0.0,
        label: str | None = None,
        stop: threading.Event | None = None,
        wake: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
        stall_after: float | None = None,
        idle_clears_after: float = 0.0,
        thread_name: str | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.name = name
        self.label = label or name
        self._body = body
        self._every = every
        self._stop = stop if stop is not None else threading.Event()
        self._wake = wake
        self._after = after
        self._backoff = backoff or Backoff()
        self._limits = limits or Limits()
        self._on_restart = on_restart
        self._stall_after = stall_after
        self._idle_clears_after = idle_clears_after
        self._last_failure: float | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._restarts = 0
        self._failures = 0
        self._failing_since: float | None = None
        self._transient = True
        self._last_error = ""
        self._round_started: float | None = None
        self._ended = False
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Exception),
            wait=self._backoff.wait(),
            stop=self._stopping,
            sleep=self._sleep,
            before_sleep=self._failed,
            reraise=True,
        )
        self._thread = threading.Thread(
            target=self.run, name=thread_name or f"fencebridge-{name}", daemon=True
        )

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def signal_stop(self) -> None:
        self._stop.set()
        if self._wake is not None:
            self._wake()

    def join(self, deadline: Deadline) -> bool:
        if self._thread.ident is None:
            return True
        self._thread.join(timeout=deadline.remaining())
        return not self._thread.is_alive()

    def run(self) -> None:
        """The loop itself, in the calling thread; returns once stopped."""
        try:
            while not self._stop.is_set():
                try:
                    self._retrying(self._round)
                except Exception as exc:  # noqa: BLE001  (tenacity gave up: only when stopping)
                    log.warning("%s failed while stopping (%s)", self.name, describe(exc))
                if self._every > 0 and not self._stop.is_set():
                    self._stop.wait(self._every)
        finally:
            with self._lock:
                self._ended = True
            if self._after is not None:
                try:
                    self._after()
                except Exception as exc:  # noqa: BLE001  (the thread is ending anyway)
                    log.warning("%s: clean-up failed (%s)", self.name, describe(exc))

    def _round(self) -> None:
        with self._lock:
            self._round_started = self._clock()
        try:
            result = self._body()
        finally:
            with self._lock:
                self._round_started = None
        with self._lock:
            if (
                result == IDLE
                and self._last_failure is not None
                and self._clock() - self._last_failure < self._idle_clears_after
            ):
                return  # nothing was done: proves nothing about the failure
            failures = self._failures
            self._failures = 0
            self._failing_since = None
            self._transient = True
        if failures:
            log.warning("%s recovered after %d restart(s)", self.name, failures)

    def _stopping(self, _state: tenacity.RetryCallState) -> bool:
        return self._stop.is_set()

    def _sleep(self, seconds: float) -> None:
        if self._backoff.sleep is not None:
            self._backoff.sleep(seconds)
        else:
            self._stop.wait(seconds)

    def _failed(self, state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        why = describe(exc) if exc is not None else "unknown failure"
        with self._lock:
            self._restarts += 1
            self._failures += 1
            self._last_failure = self._clock()
            if self._failing_since is None:
                self._failing_since = self._last_failure
            self._transient = self._transient and isinstance(exc, TransientError)
            self._last_error = why
            failures = self._failures
        log.warning(
            "%s failed (%s); restarting in %.2fs (%d in a row)", self.name, why, pause, failures
        )
        if self._on_restart is not None:
            try:
                self._on_restart(self.label)
            except Exception as metric_error:  # noqa: BLE001  (a metric must not stop the loop)
                log.warning("%s: restart not counted (%s)", self.name, describe(metric_error))

    # -- status -----------------------------------------------------------------------------------

    def status(self) -> ServiceStatus:
        now = self._clock()
        with self._lock:
            restarts, failures = self._restarts, self._failures
            since, transient, error = self._failing_since, self._transient, self._last_error
            started, ended = self._round_started, self._ended

        def result(ready: bool, live: bool, reason: str) -> ServiceStatus:
            return ServiceStatus(self.name, ready, live, reason, restarts, failures)

        if self._stop.is_set():
            return result(False, True, "stopping" if not ended else "stopped")
        if self._thread.ident is None:
            return result(False, True, "not started")
        if ended or not self._thread.is_alive():
            return result(False, False, "its thread ended")
        if since is not None:
            failing_for = now - since
            reason = (
                f"failing for {failing_for:.0f}s, {failures} restart(s) in a row; last: {error}"
            )
            over = failing_for >= self._limits.failing_seconds or (
                failures >= self._limits.restarts
            )
            return result(False, transient or not over, reason)
        if self._stall_after is not None and started is not None:
            running = now - started
            if running >= self._stall_after:
                return result(False, True, f"one round has run for {running:.0f}s")
        return result(True, True, "ok")


class ServiceGroup(Service):
    """Identical services that report as one (the worker threads)."""

    def __init__(self, name: str, members: Sequence[Service]) -> None:
        self.name = name
        self.members = list(members)

    def start(self) -> None:
        for m in self.members:
            m.start()

    def signal_stop(self) -> None:
        for m in self.members:
            m.signal_stop()

    def join(self, deadline: Deadline) -> bool:
        stopped = [m.join(deadline) for m in self.members]  # every member, not the first only
        return all(stopped)

    def status(self) -> ServiceStatus:
        statuses = [m.status() for m in self.members]
        restarts = sum(s.restarts for s in statuses)
        failures = max((s.failures for s in statuses), default=0)
        bad = [s for s in statuses if not s.ready]
        live = all(s.live for s in statuses)
        if not bad:
            return ServiceStatus(self.name, True, live, "ok", restarts, failures)
        first = bad[0]
        reason = f"{len(bad)} of {len(statuses)} not ready; {first.name}: {first.reason}"
        return ServiceStatus(self.name, False, live, reason, restarts, failures)


class Part(Protocol):
    """What a stage holds: anything that starts, and stops by a deadline (a service, the pool)."""

    def start(self) -> None: ...

    def stop(self, deadline: float | Deadline = ...) -> object: ...


class Stages:
    """A process's parts in the order the work flows through them, declared once.

    Stopped first to last: each stage has stopped (or used up what is left of the one deadline)
    before the next is told to, so nothing that hands work on stops after what it hands to.
    Started last to first for the same reason; a start that fails stops the stages already
    started, in order, before the error goes on. A stage that fails to stop is logged, and the
    ones after it still stop.
    """

    def __init__(self, stages: Sequence[tuple[str, Part]]) -> None:
        self.stages = list(stages)

    def start(self) -> None:
        started: list[tuple[str, Part]] = []
        try:
            for name, part in reversed(self.stages):
                part.start()
                started.append((name, part))
        except BaseException:
            Stages(list(reversed(started))).stop(Deadline(STOP_AFTER_FAILED_START_SECONDS))
            raise

    def stop(self, deadline: float | Deadline) -> dict[str, object]:
        """Each stage's own answer to its stop, by name (the pool's says what it released)."""
        until = Deadline.of(deadline)
        answers: dict[str, object] = {}
        for name, part in self.stages:
            try:
                answers[name] = part.stop(until)
            except Exception as exc:  # noqa: BLE001  (the stages after it still stop)
                log.warning("%s did not stop cleanly (%s)", name, describe(exc))
        return answers
