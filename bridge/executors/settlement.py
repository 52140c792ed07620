"""Turning a handler's outcome into the one fenced write that records it.

Every write here carries the claim's fence. A write the database refuses (``LeaseLost``) is
reported and dropped, never retried: the row belongs to a newer claim or is already settled. A
write whose fate is unknown (the connection broke) is reported too and left alone: if it did not
commit, the lease runs out and the next claim, with ``attempts > 1``, reconciles first.

Final settlements (succeeded, failed_terminal, unknown, quarantined) go through the run's
:class:`~bridge.executors.completer.BatchCompleter` when it has one, and are answered per claim
exactly as a single write would be. They are always the run's last step: the run hands its
settlement over and ends, and the answer's events are reported when it comes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from bridge.errors import LeaseLost, StoreUnavailable
from bridge.events import WorkEvents
from bridge.executors.completer import RunSettler
from bridge.executors.registry import JobSpec
from bridge.handlers import (
    Ambiguous,
    Context,
    HandlerOutcome,
    Quarantine,
    RateLimited,
    RetryLater,
    RetryPolicy,
    Success,
    TerminalFailure,
)
from bridge.store.settle import SettleStore
from bridge.store.work import Settlement
from bridge.types import Claim, State


@dataclass(slots=True)
class Trail:
    """What the attempt record keeps beside the outcome: set by the executor as it learns it."""

    #: the class name of the exception the outcome was classified from (never its text)
    error: str | None = None
    #: what the lookup by idempotency key found (class C)
    finding: str | None = None

    def failed_with(self, exc: BaseException) -> None:
        """Note the error an outcome came from: an explicit outcome's cause, or the exception.

        Only its class name is kept. Its traceback, and those of the errors it came from, are
        dropped: they hold the run's frames, and through them its claim and context, in a
        reference cycle with the exception (the executor keeps the outcome it classified it
        to, often the exception itself), which only the cyclic collector would free.
        """
        cause = exc.__cause__ if isinstance(exc, HandlerOutcome) else exc
        if cause is not None:
            self.error = type(cause).__name__
        chain: list[BaseException | None] = [exc]
        seen: set[int] = set()
        while chain:
            link = chain.pop()
            if link is None or id(link) in seen:
                continue
            seen.add(id(link))
            link.__traceback__ = None
            chain += [link.__cause__, link.__context__]


@dataclass(frozen=True, slots=True)
class Run:
    """One claim being executed: everything an executor needs."""

    store: SettleStore
    claim: Claim
    spec: JobSpec
    ctx: Context
    events: WorkEvents
    #: batches this run's final settlement with other runs'; None writes it alone
    completer: RunSettler | None = None
    trail: Trail = field(default_factory=Trail)


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


def write_settlement(run: Run, state: State, code: str, detail: str | None) -> None:
    """The one fenced write that moves the row to a final or parked state, alone."""
    error, finding = run.trail.error, run.trail.finding
    run.store.settle(Settlement(run.claim.ticket, state, code, detail, error, finding))


def settle_final(run: Run, action: str, state: State, code: str, detail: str | None) -> None:
    """Record a final state (succeeded, failed_terminal, unknown, quarantined) and report it.

    With a completer the settlement is handed over and the run returns at once; its events
    come with the answer (:func:`concluded`), in the thread that wrote it. Alone, it is written
    here and reported as :func:`fenced` reports a write.
    """
    if run.completer is None:
        if fenced(run, action, lambda: write_settlement(run, state, code, detail)):
            run.events.settled(run.claim, state, code)
        return
    settlement = Settlement(
        run.claim.ticket,
        state,
        code,
        detail,
        error_class=run.trail.error,
        finding=run.trail.finding,
    )
    run.completer.settle_later(settlement, partial(concluded, run, action, state, code))


def concluded(run: Run, action: str, state: State, code: str, error: BaseException | None) -> None:
    """A handed-over settlement's answer, reported as :func:`fenced` reports a write: settled,
    the lease lost (the fence refused it), or the outcome unknown. Any other error is raised:
    the batch was not written, and the row's lease will lapse."""
    if error is None:
        run.events.settled(run.claim, state, code)
    elif isinstance(error, LeaseLost):
        run.ctx.lease_lost.set()
        run.events.lease_lost(run.claim, action)
    elif isinstance(error, StoreUnavailable):
        run.events.settle_unknown(run.claim, action)
    else:
        raise error


def settle_success(run: Run, success: Success) -> None:
    settle_final(run, "complete", State.SUCCEEDED, success.code, success.detail)


def settle_outcome(run: Run, outcome: HandlerOutcome) -> None:
    """Record a non-success outcome. Ambiguous outcomes must be resolved by the executor first.

    An :class:`Ambiguous` reaching this point is parked as ``unknown``: the safe default for a
    target class that has no way to reconcile.
    """
    store, ticket, code, detail = run.store, run.claim.ticket, outcome.code, outcome.detail
    if isinstance(outcome, TerminalFailure):
        settle_final(run, "fail", State.FAILED_TERMINAL, code, detail)
    elif isinstance(outcome, Quarantine):
        settle_final(run, "quarantine", State.QUARANTINED, code, detail)
    elif isinstance(outcome, RetryLater):
        # ``is None``: an explicit zero delay means "due now", not "use the backoff".
        delay = (
            outcome.delay
            if outcome.delay is not None
            else backoff(run.spec.retry, run.claim.attempts)
        )
        states: list[State] = []
        if fenced(
            run,
            "retry",
            lambda: states.append(
                store.retry_later(
                    ticket,
                    delay,
                    code,
                    detail,
                    error=run.trail.error,
                    finding=run.trail.finding,
                )
            ),
        ):
            run.events.settled(run.claim, states[0], code)
    elif isinstance(outcome, RateLimited):
        rate_limited(run, outcome)
    elif isinstance(outcome, Ambiguous):
        park_unknown(run, code, detail)
    else:  # pragma: no cover - HandlerOutcome has exactly the five subclasses above
        raise TypeError(f"unexpected outcome {type(outcome).__name__}")


def park_unknown(run: Run, code: str, detail: str | None) -> None:
    settle_final(run, "park unknown", State.UNKNOWN, code, detail)


def rate_limited(run: Run, outcome: RateLimited) -> None:
    """The target refused the call for now: queued after its wait, the attempt given back, and
    the row's (job type, tenant) waiting as long. Not batched: it is no final settlement.

    The wait is never longer than the job type's maximum (``rate_wait_max``): a longer one is
    cut to it and reported, and the next attempt asks the target again.
    """
    ticket, wait, code, trail = run.claim.ticket, outcome.retry_after, outcome.code, run.trail
    if wait > run.spec.rate_wait_max:
        run.events.rate_wait_clamped(run.claim, wait)
        wait = run.spec.rate_wait_max
    if fenced(
        run,
        "rate limited",
        lambda: run.store.rate_limited(
            ticket, wait, code, detail=outcome.detail, error=trail.error, finding=trail.finding
        ),
    ):
        run.events.settled(run.claim, State.QUEUED, code)
