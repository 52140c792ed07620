"""RateLimited through the executors of every class: queued after the wait, no attempt used.

The scripted handlers and the bench (a clocked store, one worker step per call) are those of
``test_executors``; class D's is registered with a single attempt, so a rate limit that used
one up would leave nothing to run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from bridge.demo import invoices
from bridge.handlers import Context, RateLimited, Success
from bridge.types import State, TargetClass
from tests.integration.test_executors import START, TENANT, Bench, ScriptedApi, bench, scripted

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
    assert bench.store.claim_keys("worker", [key, sibling], timedelta(seconds=30)) == []
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
    assert bench.execute(claim).snapshot() == {"settled.succeeded": 1}
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


def test_class_c_rate_limited_perform_is_looked_up_on_a_later_attempt_and_charged(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.C)
    handler.outcomes["op"] = RateLimited(retry_after=WAIT)
    key = bench.ingest("scripted", "op")
    bench.run(key)
    bench.clock.advance(WAIT)
    handler.outcomes["op"] = Success("charged")

    assert bench.run(key).snapshot() == {"settled.succeeded": 1}
    # attempts stayed 1, so the claim performs without a lookup (the 429 said nothing applied)
    assert handler.looked_up == []
    assert handler.performed == ["op", "op"]


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
