"""Turning a handler's outcome into the one fenced write that records it.

Every write here carries the claim's fence. A write the database refuses (``LeaseLost``) is
reported and dropped, never retried: the row belongs to a newer claim or is already settled. A
write whose fate is unknown (the connection broke) is reported too and left alone: if it did not
commit, the lease runs out and the next claim, with ``attempts > 1``, reconciles first.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from bridge.errors import LeaseLost, StoreUnavailable
from bridge.events import WorkEvents
from bridge.handlers import (
    Ambiguous,
    Context,
    HandlerOutcome,
    Quarantine,
    RetryLater,
    RetryPolicy,
    Success,
    TerminalFailure,
)
from bridge.registry import JobSpec
from bridge.store import PostgresStore
from bridge.types import Claim, State


@dataclass(frozen=True, slots=True)
class Run:
    """One claim being executed: everything an executor needs."""

    store: PostgresStore
    claim: Claim
    spec: JobSpec
    ctx: Context
    events: WorkEvents


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> timedelta:
    """Exponential backoff with full jitter: uniform(0, min(max, initial * 2**(attempt-1)))."""
    ceiling = min(
        policy.backoff_max.total_seconds(),
        policy.backoff_initial.total_seconds() * 2 ** max(attempt - 1, 0),
    )
    return timedelta(seconds=(rng or random).uniform(0, ceiling))


def as_success(result: object) -> Success:
    if result is None:
        return Success()
    if isinstance(result, Success):
        return result
    raise TypeError(f"a handler returns None or Success, not {type(result).__name__}")


def fenced(run: Run, action: str, write: Callable[[], object]) -> bool:
    """Run one fenced write; report instead of raising when ownership or the outcome is lost."""
    try:
        write()
    except LeaseLost:
        run.ctx.lease_lost.set()
        run.events.lease_lost(run.claim, action)
        return False
    except StoreUnavailable:
        run.events.settle_unknown(run.claim, action)
        return False
    return True


def settle_success(run: Run, success: Success) -> None:
    ticket = run.claim.ticket
    if fenced(run, "complete", lambda: run.store.complete(ticket, success.code, success.detail)):
        run.events.settled(run.claim, State.SUCCEEDED, success.code)


def settle_outcome(run: Run, outcome: HandlerOutcome) -> None:
    """Record a non-success outcome. Ambiguous outcomes must be resolved by the executor first.

    An :class:`Ambiguous` reaching this point is parked as ``unknown``: the safe default for a
    target class that has no way to reconcile.
    """
    store, ticket, code, detail = run.store, run.claim.ticket, outcome.code, outcome.detail
    if isinstance(outcome, TerminalFailure):
        if fenced(run, "fail", lambda: store.fail_terminal(ticket, code, detail)):
            run.events.settled(run.claim, State.FAILED_TERMINAL, code)
    elif isinstance(outcome, Quarantine):
        if fenced(run, "quarantine", lambda: store.quarantine(ticket, code, detail)):
            run.events.settled(run.claim, State.QUARANTINED, code)
    elif isinstance(outcome, RetryLater):
        # ``is None``: an explicit zero delay means "due now", not "use the backoff".
        delay = (
            outcome.delay
            if outcome.delay is not None
            else backoff(run.spec.retry, run.claim.attempts)
        )
        states: list[State] = []
        if fenced(
            run, "retry", lambda: states.append(store.retry_later(ticket, delay, code, detail))
        ):
            run.events.settled(run.claim, states[0], code)
    elif isinstance(outcome, Ambiguous):
        park_unknown(run, code, detail)
    else:  # pragma: no cover - HandlerOutcome has exactly the four subclasses above
        raise TypeError(f"unexpected outcome {type(outcome).__name__}")


def park_unknown(run: Run, code: str, detail: str | None) -> None:
    ticket = run.claim.ticket
    if fenced(run, "park unknown", lambda: run.store.park_unknown(ticket, code, detail)):
        run.events.settled(run.claim, State.UNKNOWN, code)
