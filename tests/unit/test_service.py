"""The supervisor on its own: loops that cannot die, backoff that cannot overflow, honest status.

Bodies here are plain functions that fail on purpose; the waits are injected (nothing sleeps)
and so is the clock where a test is about time. The same supervisor runs the real threads in
tests/integration/test_supervision.py against a failing PostgreSQL.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

import psycopg.errors
import pytest

from bridge.errors import StoreError, StoreUnavailable
from bridge.service import (
    IDLE,
    Backoff,
    Deadline,
    Limits,
    ServiceGroup,
    ServiceStatus,
    Stages,
    Supervised,
    describe,
)

SECRET = "tenant-acme refund-1042 {'card': 'visa-secret'}"
CAP = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailsFor:
    """Raises ``error`` on the first ``times`` calls, then succeeds; stops the loop after."""

    def __init__(
        self, times: int, error: Callable[[], Exception], stop_after_successes: int = 3
    ) -> None:
        self.times = times
        self.error = error
        self.calls = 0
        self.successes = 0
        self.stop_after = stop_after_successes
        self.loop: Supervised | None = None

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error()
        self.successes += 1
        if self.successes >= self.stop_after and self.loop is not None:
            self.loop.signal_stop()


def run_to_end(loop: Supervised) -> None:
    loop.start()
    assert loop.join(Deadline(60)), "the loop never ended"


@pytest.mark.promise("nothing-silent")
def test_ten_thousand_consecutive_failures_leave_the_loop_alive_and_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits: list[float] = []
    seen: dict[str, object] = {}
    body = FailsFor(10_000, partial(RuntimeError, SECRET))
    restarts: list[str] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 5_000:  # mid-outage, from the loop's own thread
            assert body.loop is not None
            seen["mid"] = body.loop.status()
            seen["alive"] = body.loop.thread.is_alive()

    loop = Supervised(
        "claimer",
        body,
        backoff=Backoff(initial=0.1, cap=CAP, sleep=sleep),
        on_restart=restarts.append,
    )
    body.loop = loop
    with caplog.at_level(logging.WARNING, logger="bridge.service"):
        run_to_end(loop)

    assert len(waits) == 10_000
    assert all(0 <= w <= CAP for w in waits), "every wait within the cap, none overflowed"
    assert len(set(waits[-100:])) > 1, "capped waits still jitter"
    assert max(waits) > CAP / 2, "the window grew to the cap"
    assert restarts == ["claimer"] * 10_000
    assert body.successes == 3, "recovered once the fault cleared"
    mid = seen["mid"]
    assert seen["alive"] is True
    assert isinstance(mid, ServiceStatus)
    assert mid.ready is False
    assert "RuntimeError" in mid.reason
    assert "5000 restart(s) in a row" in mid.reason
    status = loop.status()
    assert (status.restarts, status.failures) == (10_000, 0)
    assert "claimer recovered after 10000 restart(s)" in caplog.text
    assert "RuntimeError" in caplog.text
    assert "acme" not in caplog.text, "no exception text logged"
    assert "visa-secret" not in caplog.text


def test_the_loop_is_ready_again_after_recovering() -> None:
    clock = FakeClock()
    statuses = []
    body = FailsFor(3, partial(StoreError, "claim: permission denied for table work_item"))

    def sleep(seconds: float) -> None:
        assert body.loop is not None
        statuses.append(body.loop.status())

    loop = Supervised("sweeper", body, backoff=Backoff(sleep=sleep), clock=clock)
    body.loop = loop
    loop.start()
    assert loop.join(Deadline(60))
    assert [s.ready for s in statuses] == [False, False, False]
    assert statuses[0].reason.endswith(
        "last: StoreError: claim: permission denied for table work_item"
    )
    # Stopped now: not ready for traffic, but alive.
    final = loop.status()
    assert (final.ready, final.live, final.reason) == (False, True, "stopped")


@pytest.mark.promise("nothing-silent")
@pytest.mark.parametrize(
    ("error", "live_at_limit"),
    [
        (partial(StoreError, "claim: cannot execute UPDATE in a read-only transaction"), False),
        (partial(KeyError, SECRET), False),
        (partial(StoreUnavailable, "claim: database unavailable (connection refused)"), True),
    ],
    ids=["refused", "bug", "unreachable"],
)
def test_liveness_fails_after_the_restart_limit_unless_a_dependency_is_unreachable(
    error: Callable[[], Exception], live_at_limit: bool
) -> None:
    limits = Limits(failing_seconds=3600, restarts=5)
    live: list[bool] = []
    body = FailsFor(8, error)

    def sleep(seconds: float) -> None:
        assert body.loop is not None
        live.append(body.loop.status().live)

    loop = Supervised("heartbeater", body, backoff=Backoff(sleep=sleep), limits=limits)
    body.loop = loop
    run_to_end(loop)
    assert live[:4] == [True] * 4
    assert live[4:] == [live_at_limit] * 4


def test_liveness_fails_after_failing_for_the_time_limit() -> None:
    clock = FakeClock()
    live: list[bool] = []
    body = FailsFor(4, partial(StoreError, "sweep: permission denied for table work_item"))

    def sleep(seconds: float) -> None:
        assert body.loop is not None
        live.append(body.loop.status().live)
        clock.now += 100  # each failure another 100 s of outage

    limits = Limits(failing_seconds=250, restarts=1000)
    loop = Supervised("sweeper", body, backoff=Backoff(sleep=sleep), limits=limits, clock=clock)
    body.loop = loop
    run_to_end(loop)
    # failing since the first failure: 0 s, 100 s, 200 s, 300 s
    assert live == [True, True, True, False]


def test_idle_rounds_between_failures_do_not_end_the_run_until_their_grace_has_passed() -> None:
    """A receiver whose writes fail polls an empty queue in between: those polls prove nothing."""
    clock = FakeClock()
    script = ["fail", "idle", "fail", "idle", "fail", "idle", "idle", "idle", "stop"]
    seen: list[tuple[int, bool]] = []

    def body() -> str | None:
        step = script.pop(0)
        clock.now += 1
        assert loop is not None
        seen.append((loop.status().failures, loop.status().live))
        if step == "fail":
            raise StoreError("ingest: permission denied for table work_item")
        if step == "stop":
            loop.signal_stop()
        return IDLE

    limits = Limits(failing_seconds=3600, restarts=3)
    loop: Supervised | None = None
    loop = Supervised(
        "receiver",
        body,
        backoff=Backoff(sleep=lambda _s: None),
        limits=limits,
        idle_clears_after=2.5,
        clock=clock,
    )
    run_to_end(loop)
    # three failures in a row despite the idle polls between them: past the limit, not live
    assert seen[:6] == [(0, True), (1, True), (1, True), (2, True), (2, True), (3, False)]
    # idle polls 1 s, 2 s, 3 s after the last failure: the third is past the grace and clears it
    assert seen[6:] == [(3, False), (3, False), (0, True)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_ended_by_a_base_exception_is_reported_dead() -> None:
    def body() -> None:
        raise SystemExit(SECRET)

    loop = Supervised("gauges", body)
    loop.start()
    loop.thread.join(timeout=60)
    status = loop.status()
    assert (status.ready, status.live, status.reason) == (False, False, "its thread ended")


def test_a_round_running_too_long_makes_the_service_unready() -> None:
    clock = FakeClock()
    entered = threading.Event()
    release = threading.Event()

    def body() -> None:
        entered.set()
        release.wait(60)

    loop = Supervised("heartbeater", body, every=0.01, stall_after=10, clock=clock)
    loop.start()
    try:
        assert entered.wait(60)
        assert loop.status().ready
        clock.now += 11
        status = loop.status()
        assert (status.ready, status.live) == (False, True)
        assert status.reason == "one round has run for 11s"
    finally:
        loop.signal_stop()
        release.set()
        assert loop.join(Deadline(60))


def test_a_failing_restart_counter_does_not_stop_the_loop() -> None:
    def broken_metric(service: str) -> None:
        raise RuntimeError("exporter down")

    body = FailsFor(3, partial(RuntimeError, SECRET))
    loop = Supervised(
        "sweeper", body, backoff=Backoff(sleep=lambda s: None), on_restart=broken_metric
    )
    body.loop = loop
    run_to_end(loop)
    assert body.successes == 3


def test_a_group_reports_its_first_unready_member() -> None:
    ok = Supervised("worker-0", lambda: None, every=60)
    failing_body = FailsFor(10**9, partial(RuntimeError, SECRET))
    failing = Supervised(
        "worker-1", failing_body, backoff=Backoff(initial=0.01, cap=0.05), label="worker"
    )
    group = ServiceGroup("workers", [ok, failing])
    group.start()
    try:
        deadline = Deadline(60)
        while group.status().ready and not deadline.expired:
            threading.Event().wait(0.01)
        status = group.status()
        assert not status.ready
        assert status.live
        assert status.reason.startswith("1 of 2 not ready; worker-1: failing for")
        assert "RuntimeError at test_service.py" in status.reason
        assert SECRET not in status.reason
    finally:
        assert group.stop(Deadline(60))


def test_one_deadline_is_shared_by_every_step() -> None:
    clock = FakeClock()
    deadline = Deadline(10, clock=clock)
    clock.now += 4
    assert deadline.remaining() == 6
    clock.now += 7
    assert deadline.remaining() == 0
    assert deadline.expired
    assert Deadline.of(deadline) is deadline


def test_describe_shows_types_and_sqlstates_never_foreign_text() -> None:
    try:
        raise ValueError(SECRET)
    except ValueError as exc:
        text = describe(exc)
    assert text.startswith("ValueError at test_service.py:")
    assert SECRET not in text
    cause = psycopg.errors.ReadOnlySqlTransaction(
        "cannot execute UPDATE in a read-only transaction"
    )
    wrapped = StoreError("heartbeat: cannot execute UPDATE in a read-only transaction")
    wrapped.__cause__ = cause
    assert describe(wrapped) == (
        "StoreError: heartbeat: cannot execute UPDATE in a read-only transaction (SQLSTATE 25006)"
    )


def test_backoff_rejects_an_empty_window() -> None:
    with pytest.raises(ValueError, match="0 < initial <= cap"):
        Backoff(initial=1.0, cap=0.5)


class _Part:
    """A stage that writes down when it starts and stops, and fails where told."""

    def __init__(self, name: str, journal: list[str], *, fail: str = "") -> None:
        self.name, self.journal, self.fail = name, journal, fail

    def start(self) -> None:
        if self.fail == "start":
            raise RuntimeError("cannot start")
        self.journal.append(f"start {self.name}")

    def stop(self, deadline: float | Deadline = 1.0) -> str:
        self.journal.append(f"stop {self.name}")
        if self.fail == "stop":
            raise RuntimeError("cannot stop")
        return f"{self.name} stopped"


def test_stages_start_last_to_first_and_stop_first_to_last_under_one_deadline() -> None:
    journal: list[str] = []
    stages = Stages([(n, _Part(n, journal)) for n in ("consumers", "pool", "sweeper")])
    stages.start()
    answers = stages.stop(Deadline(5))
    assert journal == [
        "start sweeper",
        "start pool",
        "start consumers",
        "stop consumers",
        "stop pool",
        "stop sweeper",
    ]
    assert answers["pool"] == "pool stopped"


def test_a_failed_start_stops_the_stages_already_started_in_flow_order() -> None:
    journal: list[str] = []
    parts = [_Part("consumers", journal, fail="start"), _Part("pool", journal)]
    stages = Stages([*[(p.name, p) for p in parts], ("sweeper", _Part("sweeper", journal))])
    with pytest.raises(RuntimeError, match="cannot start"):
        stages.start()
    assert journal == ["start sweeper", "start pool", "stop pool", "stop sweeper"]


def test_a_stage_that_fails_to_stop_is_logged_and_the_next_still_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[str] = []
    stages = Stages(
        [("pool", _Part("pool", journal, fail="stop")), ("health", _Part("health", journal))]
    )
    with caplog.at_level(logging.WARNING):
        answers = stages.stop(Deadline(5))
    assert journal == ["stop pool", "stop health"]
    assert "pool" not in answers
    assert "pool did not stop cleanly (RuntimeError" in caplog.text
