"""Which runs count as stuck on their worker threads, on a clock the test moves.

A run is stuck once it is still on its thread more than one lease past its lease (its trust
window, which renewals move), or for class A more than one lease past its deadline where that
is longer. The pool's status is unready while any is, and unlive while all threads are. The
behaviour on real threads, a real database and the HTTP probes is
``integration/test_supervision.py::test_handlers_stuck_past_their_lease_fail_readiness_and_every_thread_stuck_liveness``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from bridge.events import EventCounter
from bridge.handlers import Context
from bridge.runtime.heartbeat import Heartbeater, InFlight, StuckRuns
from bridge.store.settle import SettleStore
from bridge.types import Claim, TargetClass

LEASE = timedelta(seconds=10)
START = 100.0


def claim(operation: str, target_class: TargetClass = TargetClass.B) -> Claim:
    return Claim(
        tenant_id="t1",
        operation_id=operation,
        fence=1,
        attempts=1,
        max_attempts=5,
        subscription="orders",
        job_type=f"job-{target_class.value}",
        target_class=target_class,
        schema_version=None,
        payload=b"{}",
        payload_hash=b"\0" * 32,
        lease_expires_at=datetime.now(UTC),
        intent_fence=None,
        takeover=False,
    )


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def pool(threads: int) -> tuple[Heartbeater, StuckRuns, Clock]:
    # Only the status is read here: nothing calls the store.
    beats = Heartbeater(cast(SettleStore, object()), EventCounter(), interval=1.0)
    clock = Clock()
    return beats, StuckRuns(beats, threads, clock=clock), clock


def track(beats: Heartbeater, c: Claim, **options: Any) -> InFlight:
    ctx = Context(
        tenant_id=c.tenant_id,
        operation_id=c.operation_id,
        job_type=c.job_type,
        subscription=c.subscription,
        attempt=c.attempts,
        max_attempts=c.max_attempts,
        fence=c.fence,
        payload=b"{}",
    )
    return beats.track(c, ctx, LEASE, START, **options)


def test_a_run_is_stuck_one_lease_past_its_lease_and_a_renewal_moves_it() -> None:
    beats, stuck, clock = pool(threads=2)
    entry = track(beats, claim("b"))
    clock.now = START + 20 - 0.001
    assert stuck.status().ready
    clock.now = START + 20
    status = stuck.status()
    assert (status.ready, status.live) == (False, True)
    assert status.reason.startswith("1 of 2 worker thread(s)")
    assert "job type job-B" in status.reason
    assert "t1" not in status.reason
    entry.trust_until = START + 15 + 10  # renewed at 15 s: its handler reported progress
    assert stuck.status().ready
    clock.now = START + 35
    assert not stuck.status().ready


def test_a_class_a_run_is_stuck_only_one_lease_past_its_deadline_where_that_is_longer() -> None:
    beats, stuck, clock = pool(threads=2)
    track(beats, claim("a", TargetClass.A), bound=timedelta(seconds=30))
    clock.now = START + 30 + 10 - 0.001
    assert stuck.status().ready
    clock.now = START + 30 + 10
    assert not stuck.status().ready


def test_a_run_off_its_thread_is_not_stuck_and_every_thread_stuck_is_not_live() -> None:
    beats, stuck, clock = pool(threads=2)
    first, second = track(beats, claim("x")), track(beats, claim("y"))
    clock.now = START + 60
    assert stuck.status().live is False
    assert stuck.status().reason.startswith("2 of 2")
    second.running = False  # its settlement is being written; the thread is free
    assert (stuck.status().ready, stuck.status().live) == (False, True)
    beats.untrack(first.claim)
    assert stuck.status().ready
