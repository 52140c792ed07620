"""Class B executor: the target store refuses writes that carry a lower fence than it has seen.

Guarantee: a stale worker's write is rejected by the target itself (``WHERE last_fence <=
:fence``, a DynamoDB ``ConditionExpression``), because the condition travels inside the write
request (see :mod:`bridge.targets`). A refused condition is :class:`~bridge.errors.FencedOut`:
a newer claim owns the operation, so nothing is settled and nothing is retried.

An ambiguous outcome (a timeout on the write, say) becomes a retry under the next fence: the
next claim's write carries a higher fence, so it supersedes whatever the ambiguous one did, and
a write that *sets* state leaves the same result either way. On the last attempt there is no
next claim, so an ambiguous outcome is parked as ``unknown``.
"""

from __future__ import annotations

from bridge.errors import FencedOut, LeaseLost
from bridge.executors.settlement import Run, as_success, settle_outcome, settle_success
from bridge.handlers import Ambiguous, ConditionalWriteHandler, RetryLater, classify


def execute(run: Run, handler: ConditionalWriteHandler) -> None:
    try:
        success = as_success(handler.handle(run.ctx))
    except FencedOut:
        run.ctx.lease_lost.set()
        run.events.fenced_out(run.claim)
        return
    except LeaseLost:
        run.events.lease_lost(run.claim, "handler")
        return
    except Exception as exc:  # noqa: BLE001  (every exception becomes an outcome)
        run.trail.failed_with(exc)
        outcome = classify(exc)
        # With no attempt left there is no next claim to supersede a write that may have
        # landed: the outcome stays ambiguous and is parked as unknown.
        if isinstance(outcome, Ambiguous) and run.claim.attempts < run.claim.max_attempts:
            outcome = RetryLater(outcome.code, outcome.detail)
        settle_outcome(run, outcome)
        return
    settle_success(run, success)
