"""Class D executor: a target with neither fencing nor idempotency nor lookup.

Guarantee: **at most one call, ever** — not exactly-once. Before the call, the intent is
recorded under the fence (``intent_fence``). A claim that finds an intent from an earlier
attempt parks the operation as ``unknown`` without calling. An ambiguous result, a lost lease
or a crash after the intent all end in ``unknown`` (the sweeper parks an expired last attempt),
and a person reconciles out of band. Consider an approval step for high-impact actions.

``validate`` runs before the intent and is classified by the handler table. Once ``call`` is
entered the target may have acted, so anything it raises that is not an explicit outcome is
ambiguous and parked as ``unknown`` (:func:`bridge.handlers.classify_sent`): a ``ValueError``
from a reply that could not be read is not a failure anybody may retry as a new operation.

:class:`~bridge.handlers.RateLimited` is an explicit outcome wherever it is raised (a ``429``
says the target did not act), so it requeues the row after its wait without using the single
attempt, and the key waits. Raised by ``validate``, no intent was recorded and the one call can
still be made. Raised by ``call``, the intent stays recorded and is never withdrawn: the next
claim finds it and parks ``unknown`` without calling, so a 429 can never lead to a second call
unless a person redrives it.

A subscription with ``wait_for_standby`` calls only once a standby has flushed the intent
(:mod:`bridge.store.replication`): otherwise a failover to a standby that lacks it lets the
next claim call again.
"""

from __future__ import annotations

from bridge.errors import LeaseLost, StoreUnavailable
from bridge.executors.intent import call_may_have_left
from bridge.executors.settlement import (
    Run,
    as_success,
    fenced,
    park_unknown,
    settle_outcome,
    settle_success,
)
from bridge.handlers import Ambiguous, UnfencedHandler, classify, classify_sent
from bridge.types import State


def execute(run: Run, handler: UnfencedHandler) -> None:
    if call_may_have_left(run.claim.intent_fence):
        park_unknown(
            run, "intent_recorded", "an earlier attempt recorded its intent to call the target"
        )
        return
    try:
        handler.validate(run.ctx)
    except Exception as exc:  # noqa: BLE001  (nothing was called yet)
        run.trail.failed_with(exc)
        settle_outcome(run, classify(exc))
        return
    if not fenced(run, "record intent", lambda: run.store.record_intent(run.claim.ticket)):
        return  # not recorded (or not known to be): never call
    if not _intent_on_standby(run):
        return  # not known to survive a failover: not called, withdrawn, retried
    try:
        success = as_success(handler.call(run.ctx))
    except LeaseLost:
        run.events.lease_lost(run.claim, "handler")
        return
    except Exception as exc:  # noqa: BLE001  (every exception becomes an outcome)
        run.trail.failed_with(exc)
        outcome = classify_sent(exc, run.ctx)
        if isinstance(outcome, Ambiguous):
            park_unknown(run, outcome.code, "ambiguous result from an unfenced target")
        else:
            settle_outcome(run, outcome)
        return
    settle_success(run, success)


def _intent_on_standby(run: Run) -> bool:
    """For a subscription with ``wait_for_standby``: True once a standby has the intent.

    Otherwise a failover could lose the intent after the call, and the promoted server's next
    claim would call again. When the wait runs out the call has not been made, so the row is
    given back under the fence with its intent withdrawn and the attempt not counted; if that
    fails the intent stays and the next claim parks the row ``unknown`` (never a second call).
    """
    standby = run.standby
    if standby is None or not standby.applies(run.claim.subscription):
        return True
    try:
        standby.wait(run.claim.subscription, "intent")
        return True
    except StoreUnavailable as exc:
        run.trail.failed_with(exc)
    try:
        if run.store.withdraw_intent(run.claim.ticket):
            run.events.settled(run.claim, State.QUEUED, "standby_wait")
            return False
    except StoreUnavailable:
        pass
    park_unknown(run, "intent_recorded", "no standby confirmed the intent; not called")
    return False
