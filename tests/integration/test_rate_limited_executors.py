"""RateLimited through the executors of every class: queued after the wait, no attempt used.

The scripted handlers and the bench (a clocked store, one worker step per call) are those of
``test_executors``; class D's is registered with a single attempt, so a rate limit that used
one up would leave nothing to run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from bridge.demo import invoices
from bridge.handlers import Applied, Context, RateLimited, Success
from bridge.types import State, TargetClass
from tests.integration.test_executors import (
    START,
    TENANT,
    Bench,
    ScriptedApi,
    ScriptedWrite,
    bench,
    scripted,
)

__all__ = ["bench"]  # the fixture, imported for these tests

WAIT = timedelta(seconds=2)


@pytest.mark.parametrize("target", list(TargetClass), ids=lambda t: f"class-{t.value}")
def test_a_rate_limit_requeues_after_its_wait_and_gives_the_attempt_back(
    bench: Bench, target: TargetClass
) -> None:
    handler = scripted(bench, target)
    if target is TargetClass.A:
        invoices.add_invoice(bench.db, TENANT, "inv-op", amount=100)
    key = bench.ingest("scripted", "op", {"invoice_id": "inv-op"})
    handler.outcomes["op"] = RateLimited(retry_after=WAIT)
    sibling = bench.ingest("scripted", "sibling", {"invoice_id": "inv-none"})

    assert bench.run(key).snapshot() == {"settled.queued": 1}

    row = bench.row(key)
    assert (row["state"], row["attempts"], row["outcome_code"]) == ("queued", 0, "rate_limited")
    assert row["next_attempt_at"] == START + WAIT
    assert bench.store.claims.claim_keys("worker", [key, sibling], timedelta(seconds=30)) == []
    if target is TargetClass.A:
        found = invoices.find_invoice(bench.db, TENANT, "inv-op")
        assert found is not None
        assert found.status == "paid"

    bench.clock.advance(WAIT)
    claim = bench.claim(key)
    assert (claim.attempts, claim.fence) == (1, 2)
    if target is TargetClass.D:
        # The limit came from call(): the intent stays, so the next claim never calls again.
        assert bench.execute(claim).snapshot() == {"settled.unknown": 1}
        assert bench.outcome(key) == (State.UNKNOWN, "intent_recorded")
        assert handler.calls == [("op", 1)]
        return
    handler.outcomes["op"] = Success("done")
    # Class C's call left before the 429 (its intent is recorded): it looks the key up first.
    looked_up = {"reconciled.not_applied": 1} if target is TargetClass.C else {}
    assert bench.execute(claim).snapshot() == {**looked_up, "settled.succeeded": 1}
    assert bench.row(key)["attempts"] == 1


def test_class_d_rate_limited_before_the_call_never_calls_and_records_no_intent(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.D)  # one attempt only
    handler.invalid["op"] = RateLimited("quota", retry_after=30)
    handler.outcomes["op"] = None
    key = bench.ingest("scripted", "op")

    for _ in range(3):  # limited again and again: the single attempt is never used up
        assert bench.run(key).snapshot() == {"settled.queued": 1}
        row = bench.row(key)
        assert (row["state"], row["attempts"], row["intent_fence"]) == ("queued", 0, None)
        assert row["outcome_code"] == "quota"
        bench.clock.advance(timedelta(seconds=30))
    assert handler.calls == []

    del handler.invalid["op"]
    assert bench.run(key).snapshot() == {"settled.succeeded": 1}
    assert handler.calls == [("op", 4)]  # called once, under the fence that recorded its intent


def test_class_c_rate_limited_perform_is_looked_up_on_the_next_claim_and_charged(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.C)
    handler.outcomes["op"] = RateLimited(retry_after=WAIT)
    key = bench.ingest("scripted", "op")
    bench.run(key)
    bench.clock.advance(WAIT)
    handler.outcomes["op"] = Success("charged")

    claim = bench.claim(key)
    assert (claim.attempts, claim.intent_fence) == (1, 1)
    assert bench.execute(claim).snapshot() == {"reconciled.not_applied": 1, "settled.succeeded": 1}
    # The 429 gave the attempt back, but perform had been entered: a request may have left
    # before the refusal (a client's own retry after a timeout), so the key is looked up first.
    assert handler.looked_up == ["op"]
    assert handler.performed == ["op", "op"]


def test_class_c_rate_limited_perform_then_applied_is_found_and_not_performed_again(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.C)
    handler.outcomes["op"] = RateLimited(retry_after=WAIT)
    key = bench.ingest("scripted", "op")
    bench.run(key)
    bench.clock.advance(WAIT)
    handler.answers["op"] = Applied("charged", "ch_1")  # an earlier request of it landed

    assert bench.run(key).snapshot() == {"reconciled.applied": 1, "settled.succeeded": 1}
    assert bench.outcome(key) == (State.SUCCEEDED, "charged")
    assert handler.performed == ["op"]


class LimitedBeforeSending(ScriptedApi):
    """Its own quota says no before anything is sent."""

    def validate(self, ctx: Context) -> None:
        raise RateLimited(retry_after=timedelta(seconds=5))


def test_a_rate_limit_raised_by_a_class_c_validate_sends_nothing(bench: Bench) -> None:
    handler = LimitedBeforeSending()
    bench.register("limited", handler)
    key = bench.ingest("limited", "op")
    assert bench.run(key).snapshot() == {"settled.queued": 1}
    row = bench.row(key)
    assert (row["state"], row["attempts"], row["intent_fence"]) == ("queued", 0, None)
    assert handler.performed == []


def test_a_wait_longer_than_the_job_types_maximum_is_cut_to_it_and_counted(bench: Bench) -> None:
    handler = ScriptedWrite()
    bench.registry.register("capped", handler, rate_wait_max=timedelta(seconds=30))
    handler.outcomes["long"] = RateLimited(retry_after=timedelta(hours=10))
    handler.outcomes["short"] = RateLimited(retry_after=timedelta(seconds=10))
    long = bench.ingest("capped", "long")
    short = bench.ingest("capped", "short", tenant="t2")

    assert bench.run(long).snapshot() == {"settled.queued": 1, "rate_wait_clamped": 1}
    assert bench.run(short).snapshot() == {"settled.queued": 1}

    assert bench.row(long)["next_attempt_at"] == START + timedelta(seconds=30)
    assert bench.row(short)["next_attempt_at"] == START + timedelta(seconds=10)
    waits = bench.db.execute("SELECT tenant_id, until FROM rate_wait ORDER BY 1").fetchall()
    assert waits == [
        (TENANT, START + timedelta(seconds=30)),
        ("t2", START + timedelta(seconds=10)),
    ]


def test_a_wait_is_never_longer_than_fifteen_minutes_unless_configured(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.B)
    handler.outcomes["op"] = RateLimited(retry_after=timedelta(days=1))  # a date far ahead
    key = bench.ingest("scripted", "op")
    assert bench.run(key).snapshot() == {"settled.queued": 1, "rate_wait_clamped": 1}
    assert bench.row(key)["next_attempt_at"] == START + timedelta(minutes=15)
