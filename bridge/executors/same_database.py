"""Class A executor: the business write and the completion commit in one fenced transaction.

Guarantee: a stale worker cannot commit its business write. The transaction first locks the
work row ``WHERE fence = :fence AND state = 'claimed' ... FOR UPDATE``; if the claim is gone it
stops before the handler runs. While the lock is held, no claim or sweep can move the row (they
skip locked rows), so the completion at the end of the same transaction cannot be refused, and
if the transaction does not commit, neither write happened.

Because a failed transaction rolls back the business write, an ambiguous handler outcome is
known not to have applied and becomes a retry. The one real uncertainty is a connection lost
during COMMIT: then nothing is written here; if the commit did land the row is succeeded and
never claimed again, and if it did not, the lease runs out and the next claim runs the handler
again with nothing to undo.
"""

from __future__ import annotations

from bridge.errors import LeaseLost, StoreUnavailable
from bridge.executors.settlement import Run, as_success, settle_outcome
from bridge.handlers import Ambiguous, RetryLater, SameDatabaseHandler, Success, classify
from bridge.types import State


def execute(run: Run, handler: SameDatabaseHandler) -> None:
    success: Success | None = None
    try:
        with run.store.fenced_transaction(run.claim.ticket) as tx:
            success = as_success(handler.handle(run.ctx, tx.connection))
            tx.settle(State.SUCCEEDED, success.code, success.detail)
    except LeaseLost:
        # Refused at the lock: the handler never ran, or its write was rolled back.
        run.ctx.lease_lost.set()
        run.events.lease_lost(run.claim, "lock")
        return
    except StoreUnavailable:
        run.events.settle_unknown(run.claim, "commit")
        return
    except Exception as exc:  # noqa: BLE001  (every exception becomes an outcome)
        outcome = classify(exc)
        if isinstance(outcome, Ambiguous):
            # Rolled back: nothing was applied, so this is a plain retry.
            outcome = RetryLater(outcome.code, outcome.detail)
        settle_outcome(run, outcome)
        return
    assert success is not None
    run.events.settled(run.claim, State.SUCCEEDED, success.code)
