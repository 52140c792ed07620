"""Class C executor: an external API with an idempotency key and a lookup by that key.

Guarantee: **dedupe, not fencing.** The provider sees one stable, tenant-scoped, opaque key per
operation (:meth:`bridge.identity.IdentityHasher.idempotency_key`) and deduplicates repeated
requests the way it defines, for as long as it retains keys. fencebridge adds reconcile-before-
retry on top:

* on every claim of a row whose call may have left (an intent recorded, whatever the attempt
  count: :mod:`bridge.executors.intent`), on every claim with ``attempts > 1``, and after every
  ambiguous outcome, the handler's ``lookup`` runs first;
* applied → succeeded, without a second call;
* confirmed not applied → perform (on a later claim, under a new fence, if this one was
  ambiguous);
* the lookup cannot tell → ``unknown``, for a person to reconcile, if any attempt may have
  reached the provider. Before ``perform`` the attempt records its intent under the fence (as
  class D does), so a row without an intent has never called the provider: its later claims
  perform (under the same key) instead of parking a row nobody needs to reconcile;
* ``failed_terminal`` only on an explicit refusal (:class:`~bridge.handlers.TerminalFailure`).
  A retry with no attempt left is ``failed_terminal`` only when no request of the operation can
  still land; otherwise it is ``unknown`` with the reason. "Not applied" right after an
  ambiguous request says only that it has not landed *yet*, and the owner of a failed row
  sends the operation again under a new key, which no provider would deduplicate;
* the lookup raises :class:`~bridge.handlers.Quarantine` (it cannot read the payload to compare
  it with the provider's record) → ``quarantined`` when no attempt recorded an intent (nothing
  was ever sent: the row ends as its first attempt did), ``unknown`` when one did (a request may
  have left, and nobody confirmed what it did).

A :class:`~bridge.handlers.RateLimited` from ``perform`` gives its attempt back (a limit is
not the operation's failure), but the intent it recorded stays: the request it refused may not
have been the only one (a client that retries after a timeout), so the next claim looks up
first, at ``attempts = 1`` too.

Where an error is raised decides what it means. ``validate`` runs before anything is sent, so
what it raises is classified by the handler table. Once ``perform`` is entered the request may
leave at any moment: anything it raises that is not an explicit outcome (a ``ValueError`` from
a reply the client could not read, a ``KeyError`` on a missing field) is ambiguous and the key
is looked up, never taken for a failure (:func:`bridge.handlers.classify_sent`).
"""

from __future__ import annotations

from enum import StrEnum

from opentelemetry import trace

from bridge.errors import LeaseLost
from bridge.executors.intent import call_may_have_left
from bridge.executors.settlement import (
    Run,
    as_success,
    fenced,
    park_unknown,
    settle_outcome,
    settle_success,
)
from bridge.handlers import (
    Ambiguous,
    Applied,
    HandlerOutcome,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    RetryLater,
    Success,
    classify,
    classify_sent,
)
from bridge.telemetry import names


class Finding(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    CANNOT_TELL = "cannot_tell"


_tracer = trace.get_tracer(names.INSTRUMENTATION_NAME, schema_url=names.SCHEMA_URL)


def reconcile(
    run: Run, handler: IdempotentApiHandler
) -> tuple[Finding, Success | Quarantine | None]:
    """Ask the provider whether this operation's key was applied. Never raises.

    Applied comes with its success; a lookup that raised :class:`Quarantine` cannot tell, and
    comes with that quarantine (the payload, not the provider, is what it could not read).
    """
    with _tracer.start_as_current_span(
        names.SPAN_RECONCILE.format(job_type=run.claim.job_type),
        attributes={names.JOB_TYPE: run.claim.job_type, names.FENCE: run.claim.fence},
    ) as span:
        finding, success = _lookup(run, handler)
        span.set_attribute(names.FINDING, finding.value)
    run.events.reconciled(run.claim, finding.value)
    run.trail.finding = finding.value  # kept in this attempt's record by its settlement
    return finding, success


def _lookup(run: Run, handler: IdempotentApiHandler) -> tuple[Finding, Success | Quarantine | None]:
    try:
        found = handler.lookup(run.ctx, run.ctx.idempotency_key)
    except Quarantine as exc:  # the payload cannot be read: a quarantine, not an unknown
        return Finding.CANNOT_TELL, exc
    except Exception:  # noqa: BLE001  (a lookup that fails cannot tell)
        finding, success = Finding.CANNOT_TELL, None
    else:
        if isinstance(found, Applied):
            finding, success = Finding.APPLIED, Success(found.code, found.detail)
        elif isinstance(found, NotApplied):
            finding, success = Finding.NOT_APPLIED, None
        else:
            finding, success = Finding.CANNOT_TELL, None
    return finding, success


def execute(run: Run, handler: IdempotentApiHandler) -> None:
    sent = call_may_have_left(run.claim.intent_fence)  # by an earlier attempt
    if (sent or run.claim.attempts > 1) and _settled_by_lookup(run, handler, sent):
        return
    if not _validated(run, handler, sent):
        return
    if not fenced(run, "record intent", lambda: run.store.record_intent(run.claim.ticket)):
        return  # not recorded (or not known to be): never call
    try:
        # From here on the request may have left: only an explicit outcome is not ambiguous.
        success = as_success(handler.perform(run.ctx, run.ctx.idempotency_key))
    except LeaseLost:
        run.events.lease_lost(run.claim, "handler")
        return
    except Exception as exc:  # noqa: BLE001  (every exception becomes an outcome)
        run.trail.failed_with(exc)
        outcome = classify_sent(exc, run.ctx)
        if isinstance(outcome, Ambiguous):
            _resolve(run, handler, outcome)
        else:
            _settle(run, outcome, may_land=sent)
        return
    settle_success(run, success)


def _settled_by_lookup(run: Run, handler: IdempotentApiHandler, sent: bool) -> bool:
    """A later claim looks the key up before acting; True when that ended the run.

    ``sent``: an earlier attempt recorded its intent, so a request may have reached it.
    """
    finding, found = reconcile(run, handler)
    if isinstance(found, Success):
        settle_success(run, found)
    elif isinstance(found, Quarantine) and not sent:
        settle_outcome(run, found)
    elif isinstance(found, Quarantine):
        park_unknown(run, "reconcile_failed", _UNREADABLE)
    elif finding is Finding.CANNOT_TELL and sent:
        park_unknown(run, "reconcile_failed", "lookup could not tell whether it was applied")
    else:
        # Not applied, or no attempt ever recorded an intent: the provider was never called
        # for this operation, so there is nothing to reconcile and performing is safe.
        return False
    return True


def _validated(run: Run, handler: IdempotentApiHandler, sent: bool) -> bool:
    """Run the checks before sending; False when they ended the run (settled or lost)."""
    try:
        handler.validate(run.ctx)
    except LeaseLost:
        run.events.lease_lost(run.claim, "handler")
        return False
    except Exception as exc:  # noqa: BLE001  (nothing was sent yet)
        run.trail.failed_with(exc)
        _settle(run, _retry_if_ambiguous(classify(exc)), may_land=sent)
        return False
    return True


def _resolve(run: Run, handler: IdempotentApiHandler, outcome: Ambiguous) -> None:
    """An ambiguous perform: the lookup decides, never the exception."""
    finding, found = reconcile(run, handler)
    if isinstance(found, Success):
        settle_success(run, found)
    elif isinstance(found, Quarantine):
        # This attempt's request may have left: a lookup that cannot read the payload cannot
        # say what it did.
        park_unknown(run, outcome.code, _UNREADABLE)
    elif finding is Finding.NOT_APPLIED:
        # Not applied *yet*: perform again, under the same key and the next claim's fence (the
        # provider deduplicates a request of this one that lands meanwhile).
        _settle(run, RetryLater(outcome.code, "the lookup found nothing yet"), may_land=True)
    else:
        park_unknown(run, outcome.code, "ambiguous result and the lookup could not tell")


def _settle(run: Run, outcome: HandlerOutcome, *, may_land: bool) -> None:
    """Record an explicit outcome. A retry with no attempt left becomes ``unknown`` instead of
    ``failed_terminal`` when a request of this operation may still land (``may_land``)."""
    if (
        may_land
        and isinstance(outcome, RetryLater)
        and run.claim.attempts >= run.claim.max_attempts
    ):
        park_unknown(run, outcome.code, _MAY_STILL_LAND)
    else:
        settle_outcome(run, outcome)


_MAY_STILL_LAND = (
    "no attempt left, and a request of this operation may still land: a lookup that found "
    "nothing yet is no confirmed failure"
)
_UNREADABLE = "the lookup could not read the payload, and a request may have reached the provider"


def _retry_if_ambiguous(outcome: HandlerOutcome) -> HandlerOutcome:
    """Before the call nothing can have been applied: an unanticipated error is a retry."""
    if isinstance(outcome, Ambiguous):
        return RetryLater(outcome.code, "raised before the request was sent")
    return outcome
