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

Messages the handler publishes (``ctx.outbox.publish``, :mod:`bridge.outbox.publish`) are rows
written in the same transaction: they commit with the business write and the completion, or vanish
with them. The relay sends them after commit.

The transaction runs under the handler's deadline (:mod:`bridge.deadline`): a handler blocked on
a business-row lock or stuck in a call does not hold its row and connection forever. Past the
deadline the transaction is cancelled and rolled back, so the run is a plain retry (known not
applied), never ``unknown``. The same holds when the server cancels a statement of the handler
(``statement_timeout``, ``lock_timeout``) or rolls the transaction back (a deadlock): the error
says nothing was applied. While the lock is held the lease is not what ends the run:
``ctx.progress()`` does not raise for it.
"""

from __future__ import annotations

from bridge.errors import DeadlineExceeded, LeaseLost, StoreUnavailable
from bridge.executors.settlement import Run, as_success, settle_outcome
from bridge.handlers import Ambiguous, RetryLater, SameDatabaseHandler, Success, classify
from bridge.outbox.publish import NO_OUTBOX, Outbox
from bridge.types import State

#: the outcome code of a run whose transaction outlived its handler's deadline
DEADLINE_CODE = "deadline_exceeded"


def execute(run: Run, handler: SameDatabaseHandler) -> None:
    success: Success | None = None
    try:
        with run.store.fenced_transaction(run.claim.ticket, deadline=handler.deadline) as tx:
            run.ctx.outbox = Outbox(
                tx.connection,
                run.ctx,
                destinations=run.spec.outbox_destinations,
                trace_context=run.claim.trace_context,
            )
            try:
                with run.ctx.holding_row(tx.deadline):
                    success = as_success(handler.handle(run.ctx, tx.connection))
            finally:
                run.ctx.outbox = NO_OUTBOX
            tx.settle(State.SUCCEEDED, success.code, success.detail)
    except LeaseLost:
        # Refused at the lock: the handler never ran, or its write was rolled back.
        run.ctx.lease_lost.set()
        run.events.lease_lost(run.claim, "lock")
        return
    except DeadlineExceeded as exc:
        # Cancelled and rolled back: nothing was applied. Retried, never parked unknown.
        settle_outcome(run, RetryLater(DEADLINE_CODE, str(exc)))
        return
    except StoreUnavailable as exc:
        if exc.outcome_unknown:
            # The connection broke, perhaps during COMMIT: leave the row to its lease.
            run.events.settle_unknown(run.claim, "commit")
        else:
            # The server refused or cancelled a statement and rolled the transaction back.
            settle_outcome(run, RetryLater("rolled_back", str(exc)))
        return
    except Exception as exc:  # noqa: BLE001  (every exception becomes an outcome)
        run.trail.failed_with(exc)
        outcome = classify(exc)
        if isinstance(outcome, Ambiguous):
            # Rolled back: nothing was applied, so this is a plain retry.
            outcome = RetryLater(outcome.code, outcome.detail)
        settle_outcome(run, outcome)
        return
    assert success is not None
    run.events.settled(run.claim, State.SUCCEEDED, success.code)
