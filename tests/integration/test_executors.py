"""The fenced executors, class by class: every outcome a handler can end in, and what is recorded.

Real PostgreSQL (the store's clock is injected, so leases expire without sleeping), the demo
payment provider over real HTTP for class C. Each handler run goes through
:func:`bridge.executors.execute` exactly as a worker runs it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest

from bridge.database import Connection
from bridge.demo import invoices, payments
from bridge.demo.provider import (
    FaultKind,
    PaymentClient,
    PaymentProvider,
    ProviderConflict,
)
from bridge.errors import LeaseLost
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import (
    Ambiguous,
    Applied,
    CannotTell,
    ConditionalWriteHandler,
    Context,
    HandlerOutcome,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    RetryLater,
    RetryPolicy,
    SameDatabaseHandler,
    Success,
    TerminalFailure,
    UnfencedHandler,
)
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    RedriveFilter,
    State,
    TargetClass,
    Ticket,
)
from tests.support.clock import Clock
from tests.support.deliveries import for_job
from tests.support.waiting import eventually
from tests.support.worker_process import context_for

Db = psycopg.Connection[Any]

START = datetime(2022, 6, 1, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TENANT = "t1"
CHARGE = {"amount": 1200, "currency": "eur", "reference": "order-1"}
#: long enough for any backoff of the default retry policy to come due
PAST_ANY_BACKOFF = timedelta(hours=1)

QUEUED, SUCCEEDED, FAILED = State.QUEUED, State.SUCCEEDED, State.FAILED_TERMINAL
UNKNOWN, QUARANTINED = State.UNKNOWN, State.QUARANTINED


class Bench:
    """A registry, a clocked store and the steps of a worker, one call each."""

    def __init__(self, store: PostgresStore, db: Db) -> None:
        self.clock = Clock(START)
        self.store = PostgresStore(store.pool, clock=self.clock)
        self.db = db
        self.hasher = IdentityHasher(b"executor-tests-identity-secret")
        self.registry = Registry()

    def register(self, job: str, handler: Any, *, max_attempts: int = 5) -> None:
        self.registry.register(job, handler, retry=RetryPolicy(max_attempts=max_attempts))

    def ingest(
        self, job: str, operation: str, payload: object = None, *, tenant: str = TENANT
    ) -> Key:
        (result,) = self.store.inbox.ingest([self.delivery(job, operation, payload, tenant=tenant)])
        assert result.decision is Decision.NEW
        return Key(tenant, operation)

    def delivery(
        self, job: str, operation: str, payload: object = None, *, tenant: str = TENANT
    ) -> Delivery:
        return for_job(self.registry, job, operation, payload, tenant=tenant)

    def claim(self, key: Key) -> Claim:
        (claim,) = self.store.claims.claim_keys("worker", [key], LEASE)
        return claim

    def execute(self, claim: Claim) -> EventCounter:
        events = EventCounter()
        spec = self.registry[claim.job_type]
        execute(Run(self.store.settle, claim, spec, context_for(claim, self.hasher), events))
        return events

    def run(self, key: Key) -> EventCounter:
        return self.execute(self.claim(key))

    def lapse(self) -> None:
        self.clock.advance(LEASE * 2)

    def row(self, key: Key) -> dict[str, Any]:
        cur = self.db.execute(
            "SELECT state, fence, attempts, outcome_code, outcome_detail, intent_fence,"
            "       next_attempt_at"
            "  FROM work_item WHERE tenant_id = %s AND operation_id = %s",
            (key.tenant_id, key.operation_id),
        )
        found = cur.fetchone()
        assert found is not None
        return dict(zip([c.name for c in cur.description or ()], found, strict=True))

    def outcome(self, key: Key) -> tuple[State, str]:
        row = self.row(key)
        return State(row["state"]), row["outcome_code"]


@pytest.fixture
def bench(store: PostgresStore, db: Db) -> Bench:
    invoices.install(db)
    return Bench(store, db)


@pytest.fixture
def provider() -> Iterator[PaymentProvider]:
    with PaymentProvider() as p:
        yield p


@pytest.fixture
def charges(bench: Bench, provider: PaymentProvider) -> PaymentClient:
    """The demo charge handler registered against the provider; returns its client."""
    client = PaymentClient(provider.url, timeout=0.5)
    bench.register(payments.JOB_TYPE, payments.ChargeCustomer(client))
    return client


# -- scripted handlers: one per class, each ends in the outcome it is given ----------------------

#: what a scripted handler ends in: a value to return, an exception to raise, or a function
#: that runs inside the handler and returns or raises
Outcome = Success | BaseException | Callable[[], Success | None] | None


def act(outcome: Outcome) -> Success | None:
    if isinstance(outcome, BaseException):
        raise outcome
    if callable(outcome):
        return outcome()
    return outcome


class ScriptedRefund(SameDatabaseHandler):
    """Refunds its invoice in the fenced transaction, then ends as scripted."""

    def __init__(self) -> None:
        self._refund = invoices.RefundInvoice()
        self.outcomes: dict[str, Outcome] = {}

    def handle(self, ctx: Context, tx: Connection) -> Success | None:
        self._refund.handle(ctx, tx)
        return act(self.outcomes[ctx.operation_id])


class ScriptedWrite(ConditionalWriteHandler):
    def __init__(self) -> None:
        self.outcomes: dict[str, Outcome] = {}

    def handle(self, ctx: Context) -> Success | None:
        return act(self.outcomes[ctx.operation_id])


class ScriptedApi(IdempotentApiHandler):
    """``perform`` ends as scripted; ``lookup`` answers as scripted (not applied by default)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Outcome] = {}
        self.answers: dict[str, Applied | NotApplied | CannotTell] = {}
        self.performed: list[str] = []
        self.looked_up: list[str] = []

    def perform(self, ctx: Context, key: str) -> Success | None:
        self.performed.append(ctx.operation_id)
        return act(self.outcomes[ctx.operation_id])

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        self.looked_up.append(ctx.operation_id)
        answer = self.answers.get(ctx.operation_id, NotApplied())
        if isinstance(answer, CannotTell):
            raise answer
        return answer


class ScriptedCall(UnfencedHandler):
    """``call`` ends as scripted; records the intent fence it saw in the database when called."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self.outcomes: dict[str, Outcome] = {}
        self.invalid: dict[str, BaseException] = {}
        self.calls: list[tuple[str, int | None]] = []

    def validate(self, ctx: Context) -> None:
        if ctx.operation_id in self.invalid:
            raise self.invalid[ctx.operation_id]

    def call(self, ctx: Context) -> Success | None:
        seen = self._db.execute(
            "SELECT intent_fence FROM work_item WHERE tenant_id = %s AND operation_id = %s",
            (ctx.tenant_id, ctx.operation_id),
        ).fetchone()
        self.calls.append((ctx.operation_id, seen[0] if seen else None))
        return act(self.outcomes[ctx.operation_id])


def scripted(bench: Bench, target: TargetClass, *, max_attempts: int = 5) -> Any:
    """Register the scripted handler of a class as job ``scripted``; class D gets one attempt."""
    handler: Any = {
        TargetClass.A: ScriptedRefund,
        TargetClass.B: ScriptedWrite,
        TargetClass.C: ScriptedApi,
    }.get(target)
    if handler is None:
        bench.register("scripted", ScriptedCall(bench.db), max_attempts=1)
    else:
        bench.register("scripted", handler(), max_attempts=max_attempts)
    return bench.registry["scripted"].handler


# -- the outcome table ---------------------------------------------------------------------------

AMBIGUOUS_BY_CLASS = {
    # A: the transaction rolled back, so nothing applied: a plain retry.
    TargetClass.A: QUEUED,
    # B: the next claim's write carries a higher fence and supersedes it.
    TargetClass.B: QUEUED,
    # C: reconciled by lookup; the scripted lookup confirms "not applied".
    TargetClass.C: QUEUED,
    # D: nobody can ask: parked.
    TargetClass.D: UNKNOWN,
}


#: the classes whose handlers call out: an exception raised once the call started is ambiguous
CALLS_OUT = (TargetClass.C, TargetClass.D)


def is_raw(outcome: Outcome) -> bool:
    """A plain exception, not one of the handler API's outcomes."""
    return isinstance(outcome, BaseException) and not isinstance(outcome, HandlerOutcome)


def expected(target: TargetClass, kind: str, code: str, *, raw: bool) -> tuple[State, str]:
    """What the table says: the state per outcome kind, refined by target class.

    ``raw``: the handler raised a plain exception, not an outcome. Classes A and B classify it
    by the table; for C and D it was raised after the call started, so it is ambiguous.
    """
    if raw and target in CALLS_OUT:
        kind = "ambiguous"
    if kind == "retry" and target is TargetClass.D:
        return FAILED, "attempts_exhausted"  # one attempt only, and it confirmed nothing applied
    state = {
        "success": SUCCEEDED,
        "terminal": FAILED,
        "retry": QUEUED,
        "quarantine": QUARANTINED,
        "ambiguous": AMBIGUOUS_BY_CLASS[target],
    }[kind]
    return state, code


TABLE: list[tuple[str, Outcome, str, str]] = [
    ("returns-none", None, "success", "ok"),
    ("returns-success", Success("done", "receipt-1"), "success", "done"),
    ("terminal", TerminalFailure("refused", "no such account"), "terminal", "refused"),
    ("retry", RetryLater("busy"), "retry", "busy"),
    ("ambiguous", Ambiguous("lost_answer"), "ambiguous", "lost_answer"),
    ("quarantine", Quarantine("unreadable"), "quarantine", "unreadable"),
    # uncaught exceptions, by the default classification table
    ("value-error", ValueError("bad amount"), "terminal", "ValueError"),
    ("key-error", KeyError("amount"), "terminal", "KeyError"),
    ("permission-error", PermissionError("denied"), "terminal", "PermissionError"),
    ("json-error", json.JSONDecodeError("bad", "{", 0), "quarantine", "JSONDecodeError"),
    (
        "unicode-error",
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        "quarantine",
        "UnicodeDecodeError",
    ),
    ("refused", ConnectionRefusedError(), "retry", "ConnectionRefusedError"),
    ("timeout", TimeoutError(), "ambiguous", "TimeoutError"),
    ("reset", ConnectionResetError(), "ambiguous", "ConnectionResetError"),
    ("unclassified", RuntimeError("boom"), "ambiguous", "RuntimeError"),
]


@pytest.mark.parametrize("target", list(TargetClass), ids=lambda t: f"class-{t.value}")
def test_every_outcome_settles_once_as_the_table_says(bench: Bench, target: TargetClass) -> None:
    handler = scripted(bench, target)
    keys: dict[str, Key] = {}
    for name, outcome, _, _ in TABLE:
        handler.outcomes[name] = outcome
        if target is TargetClass.A:
            invoices.add_invoice(bench.db, TENANT, f"inv-{name}", amount=100)
        keys[name] = bench.ingest("scripted", name, {"invoice_id": f"inv-{name}"})

    got, want, events = {}, {}, {}
    for name, _, kind, code in TABLE:
        counts = bench.run(keys[name]).snapshot()
        got[name] = bench.outcome(keys[name])
        want[name] = expected(target, kind, code, raw=is_raw(handler.outcomes[name]))
        # Nothing swallowed: exactly one settlement event per run and nothing else.
        events[name] = counts
    assert got == want
    for name, counts in events.items():
        settled = {k: v for k, v in counts.items() if k.startswith("settled.")}
        others = {k: v for k, v in counts.items() if not k.startswith(("settled.", "reconciled."))}
        assert settled == {f"settled.{got[name][0].value}": 1}, name
        assert others == {}, name

    if target is TargetClass.A:
        # The refund and the completion commit together, or neither does.
        for name, key in keys.items():
            found = invoices.find_invoice(bench.db, TENANT, f"inv-{name}")
            assert found is not None
            refunded = bench.outcome(key)[0] is SUCCEEDED
            assert found.status == ("refunded" if refunded else "paid"), name
    if target is TargetClass.C:
        # Lookups happen exactly after ambiguous outcomes (the first attempt performs at once).
        ambiguous = sorted(
            n for n, outcome, kind, _ in TABLE if kind == "ambiguous" or is_raw(outcome)
        )
        assert sorted(handler.looked_up) == ambiguous
        assert sorted(handler.performed) == sorted(keys)
    if target is TargetClass.D:
        # The intent was recorded under the fence before every call.
        assert sorted(handler.calls) == sorted((name, 1) for name in keys)


def test_a_wrong_return_value_is_a_terminal_failure_not_a_success(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.B)
    handler.outcomes["odd"] = lambda: cast(Any, "ok")  # not None, not a Success
    key = bench.ingest("scripted", "odd")
    bench.run(key)
    assert bench.outcome(key) == (FAILED, "TypeError")


def test_an_explicit_zero_delay_is_retried_at_once(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.B)
    handler.outcomes["now"] = RetryLater("again", delay=timedelta(0))
    handler.outcomes["later"] = RetryLater("again", delay=timedelta(minutes=7))
    now, later = bench.ingest("scripted", "now"), bench.ingest("scripted", "later")
    bench.run(now)
    bench.run(later)
    assert bench.row(now)["next_attempt_at"] == START
    assert bench.row(later)["next_attempt_at"] == START + timedelta(minutes=7)


def test_class_b_ambiguous_on_the_last_attempt_is_unknown_not_failed(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.B, max_attempts=2)
    handler.outcomes["w"] = TimeoutError()
    key = bench.ingest("scripted", "w")
    bench.run(key)
    assert bench.outcome(key) == (QUEUED, "TimeoutError")  # the next fence supersedes it
    bench.clock.advance(PAST_ANY_BACKOFF)
    bench.run(key)
    # No next claim will supersede a write that may have landed: nobody knows.
    assert bench.outcome(key) == (UNKNOWN, "TimeoutError")


@pytest.mark.parametrize("target", list(TargetClass), ids=lambda t: f"class-{t.value}")
def test_a_handler_that_learns_its_lease_is_lost_writes_nothing(
    bench: Bench, target: TargetClass
) -> None:
    handler = scripted(bench, target)
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=100)
    key = bench.ingest("scripted", "op", {"invoice_id": "inv-1"})
    claim = bench.claim(key)
    handler.outcomes["op"] = LeaseLost(TENANT, "op", claim.fence, "progress")

    counts = bench.execute(claim).snapshot()

    assert counts == {"lease_lost": 1}
    row = bench.row(key)
    assert (row["state"], row["fence"], row["outcome_code"]) == ("claimed", 1, None)
    if target is TargetClass.A:
        found = invoices.find_invoice(bench.db, TENANT, "inv-1")
        assert found is not None
        assert found.status == "paid"


# -- class A ------------------------------------------------------------------------------------


def test_class_a_refund_commits_with_the_completion(bench: Bench) -> None:
    bench.register(invoices.JOB_TYPE, invoices.RefundInvoice())
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=1200)
    key = bench.ingest(invoices.JOB_TYPE, "refund-1", {"invoice_id": "inv-1"})

    assert bench.run(key).snapshot() == {"settled.succeeded": 1}

    assert bench.outcome(key) == (SUCCEEDED, "refunded")
    assert invoices.find_invoice(bench.db, TENANT, "inv-1") == invoices.Invoice(
        TENANT, "inv-1", 1200, "eur", "refunded", 1, "refund-1"
    )


def test_class_a_status_guard_refuses_a_second_refund_of_the_same_invoice(bench: Bench) -> None:
    bench.register(invoices.JOB_TYPE, invoices.RefundInvoice())
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=1200)
    invoices.add_invoice(bench.db, TENANT, "inv-draft", amount=1200, status="draft")
    first = bench.ingest(invoices.JOB_TYPE, "refund-1", {"invoice_id": "inv-1"})
    second = bench.ingest(invoices.JOB_TYPE, "refund-2", {"invoice_id": "inv-1"})
    draft = bench.ingest(invoices.JOB_TYPE, "refund-3", {"invoice_id": "inv-draft"})
    missing = bench.ingest(invoices.JOB_TYPE, "refund-4", {"invoice_id": "inv-none"})
    invalid = bench.ingest(invoices.JOB_TYPE, "refund-5", {"invoice": "inv-1"})

    for key in (first, second, draft, missing, invalid):
        bench.run(key)

    assert bench.outcome(first) == (SUCCEEDED, "refunded")
    assert bench.outcome(second) == (FAILED, "not_refundable")
    assert bench.outcome(draft) == (FAILED, "not_refundable")
    assert bench.outcome(missing) == (FAILED, "not_refundable")
    assert bench.outcome(invalid) == (QUARANTINED, "invalid_payload")
    found = invoices.find_invoice(bench.db, TENANT, "inv-1")
    assert found is not None
    assert found.refund_operation_id == "refund-1"


def test_class_a_refund_already_made_by_the_same_operation_is_a_success(bench: Bench) -> None:
    bench.register(invoices.JOB_TYPE, invoices.RefundInvoice())
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=1200)
    key = bench.ingest(invoices.JOB_TYPE, "refund-1", {"invoice_id": "inv-1"})
    bench.db.execute(
        "UPDATE demo_invoice SET status = 'refunded', refunded_fence = 0,"
        " refund_operation_id = 'refund-1' WHERE invoice_id = 'inv-1'"
    )
    bench.run(key)
    assert bench.outcome(key) == (SUCCEEDED, "already_refunded")


@pytest.mark.promise("fence-refusal")
def test_class_a_stale_claim_is_refused_at_the_lock_before_the_handler_runs(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.A)
    handler.outcomes["op"] = None
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=100)
    key = bench.ingest("scripted", "op", {"invoice_id": "inv-1"})
    stale = bench.claim(key)
    bench.lapse()
    current = bench.claim(key)

    assert bench.execute(stale).snapshot() == {"lease_lost": 1}
    found = invoices.find_invoice(bench.db, TENANT, "inv-1")
    assert found is not None
    assert found.status == "paid"

    assert bench.execute(current).snapshot() == {"settled.succeeded": 1}
    found = invoices.find_invoice(bench.db, TENANT, "inv-1")
    assert found is not None
    assert (found.status, found.refunded_fence) == ("refunded", 2)


def test_class_a_handler_past_its_lease_still_commits_the_sweeper_cannot_take_a_locked_row(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.A, max_attempts=1)
    invoices.add_invoice(bench.db, TENANT, "inv-1", amount=100)
    key = bench.ingest("scripted", "op", {"invoice_id": "inv-1"})
    swept: list[Ticket] = []
    rivals: list[Claim] = []

    def outlive_the_lease() -> None:
        bench.lapse()  # the refund is written, the lease is over ...
        swept.extend(bench.store.settle.sweep().parked)  # ... and neither the sweeper
        rivals.extend(bench.store.claims.claim("rival", 1, LEASE))  # nor a claim can take the row

    handler.outcomes["op"] = outlive_the_lease

    assert bench.run(key).snapshot() == {"settled.succeeded": 1}
    assert (swept, rivals) == ([], [])
    row = bench.row(key)
    assert (row["state"], row["fence"]) == ("succeeded", 1)


# -- class C: reconcile before acting, with the provider over HTTP -------------------------------


def key_of(bench: Bench, key: Key) -> str:
    return bench.hasher.idempotency_key(key.tenant_id, key.operation_id)


def test_class_c_first_attempt_charges_once(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    assert bench.run(key).snapshot() == {"settled.succeeded": 1}
    (charge,) = provider.ledger()
    assert bench.row(key)["outcome_detail"] == charge.id
    assert (charge.amount, charge.currency, charge.reference) == (1200, "eur", "order-1")
    ikey = key_of(bench, key)
    assert charge.idempotency_key == ikey
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (1, 0)
    assert bench.row(key)["intent_fence"] == 1  # recorded before the request left


@pytest.mark.promise("class-c-lookup")
def test_class_c_later_attempt_finds_the_charge_and_does_not_perform(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    bench.claim(key)
    charges.charge(ikey, CHARGE)  # the first attempt charged, then its worker vanished
    bench.lapse()

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.applied": 1, "settled.succeeded": 1}
    (charge,) = provider.ledger()
    row = bench.row(key)
    assert (row["state"], row["attempts"], row["outcome_detail"]) == ("succeeded", 2, charge.id)
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (1, 1)


def test_class_c_later_attempt_performs_when_the_lookup_confirms_nothing_was_applied(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    bench.claim(key)
    bench.lapse()

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.not_applied": 1, "settled.succeeded": 1}
    assert provider.charges_for(ikey) == 1
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (1, 1)


def test_class_c_later_attempt_that_cannot_tell_is_unknown_and_never_performs(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    bench.store.settle.record_intent(
        bench.claim(key).ticket
    )  # it was about to charge, then vanished
    bench.lapse()
    provider.set_fault(FaultKind.LOOKUP_UNAVAILABLE, key=ikey)

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.cannot_tell": 1, "settled.unknown": 1}
    assert bench.outcome(key) == (UNKNOWN, "reconcile_failed")
    assert provider.requests_for(ikey) == 0


def test_class_c_later_attempt_of_a_row_that_never_called_the_provider_is_not_parked(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    bench.claim(key)  # its worker vanished before recording an intent: nothing was sent
    bench.lapse()
    provider.set_fault(FaultKind.LOOKUP_UNAVAILABLE, key=ikey)

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.cannot_tell": 1, "settled.succeeded": 1}
    assert bench.outcome(key) == (SUCCEEDED, "charged")
    assert (provider.charges_for(ikey), provider.requests_for(ikey)) == (1, 1)
    assert bench.row(key)["intent_fence"] == 2


def test_class_c_redriven_quarantined_row_is_quarantined_again_not_parked_unknown(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", {"amount": "12.00", "currency": "eur"})
    ikey = key_of(bench, key)
    bench.run(key)
    assert bench.outcome(key) == (QUARANTINED, "invalid_payload")
    (moved,) = bench.store.operator.redrive(
        RedriveFilter(states=(QUARANTINED,)), actor="oncall", reason="handler fixed?"
    )
    assert moved.key == key

    # The redriven row's lookup runs first (attempts > 1) and cannot read the payload either:
    # that is a quarantine, with the handler's reason, not an outcome nobody can confirm.
    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.cannot_tell": 1, "settled.quarantined": 1}
    assert bench.outcome(key) == (QUARANTINED, "invalid_payload")
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (0, 0)


def test_class_c_lookup_that_cannot_read_the_payload_after_an_intent_is_unknown(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", {"amount": "12.00", "currency": "eur"})
    ikey = key_of(bench, key)
    # An earlier attempt recorded its intent (a request may have left), then vanished.
    bench.store.settle.record_intent(bench.claim(key).ticket)
    bench.lapse()

    counts = bench.run(key).snapshot()

    # Its lookup cannot read the payload: nobody can say what that request did.
    assert counts == {"reconciled.cannot_tell": 1, "settled.unknown": 1}
    assert bench.outcome(key) == (UNKNOWN, "reconcile_failed")
    assert provider.requests_for(ikey) == 0


@pytest.mark.promise("class-c-lookup")
def test_class_c_timeout_after_the_charge_applied_is_reconciled_as_applied(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.APPLY_THEN_TIMEOUT, key=ikey, seconds=5)

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.applied": 1, "settled.succeeded": 1}
    (charge,) = provider.ledger()
    assert bench.row(key)["outcome_detail"] == charge.id
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (1, 1)


def test_class_c_reset_after_the_charge_applied_is_reconciled_as_applied(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.RESET_AFTER_APPLY, key=ikey)

    assert bench.run(key).snapshot() == {"reconciled.applied": 1, "settled.succeeded": 1}
    assert provider.charges_for(ikey) == 1


def test_class_c_reset_before_apply_retries_later_and_the_later_claim_charges_once(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.RESET_BEFORE_APPLY, key=ikey)

    first = bench.run(key).snapshot()

    assert first == {"reconciled.not_applied": 1, "settled.queued": 1}
    assert bench.outcome(key) == (QUEUED, "provider_connection_error")
    assert provider.charges_for(ikey) == 0
    assert bench.store.claims.claim("worker", 1, LEASE) == [], "not due before its backoff"

    bench.clock.advance(PAST_ANY_BACKOFF)
    second = bench.run(key).snapshot()

    assert second == {"reconciled.not_applied": 1, "settled.succeeded": 1}
    row = bench.row(key)
    assert (row["state"], row["fence"], row["attempts"]) == ("succeeded", 2, 2)
    assert provider.charges_for(ikey) == 1
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (2, 2)
    # Each attempt's record keeps the error its outcome came from and its lookup's finding.
    recorded = [
        (a.fence, a.outcome, a.error_class, a.finding)
        for a in bench.store.operator.history(key).attempts
    ]
    assert recorded == [
        (1, "queued", "ProviderConnectionError", "not_applied"),
        (2, "succeeded", None, "not_applied"),
    ]


def test_class_c_ambiguous_result_with_a_lookup_that_cannot_tell_is_unknown(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.APPLY_THEN_500, key=ikey)
    provider.set_fault(FaultKind.LOOKUP_UNAVAILABLE, key=ikey)

    counts = bench.run(key).snapshot()

    assert counts == {"reconciled.cannot_tell": 1, "settled.unknown": 1}
    assert bench.outcome(key) == (UNKNOWN, "provider_server_error")
    # The charge did happen: exactly why neither failure nor a retry would be honest.
    assert provider.charges_for(ikey) == 1


def test_class_c_timeout_on_the_last_attempt_that_the_lookup_cannot_find_yet_is_unknown(
    bench: Bench, provider: PaymentProvider
) -> None:
    client = PaymentClient(provider.url, timeout=0.3)
    bench.register(payments.JOB_TYPE, payments.ChargeCustomer(client), max_attempts=1)
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.LATE_APPLY, key=ikey, seconds=1.0)  # lands after the lookup

    counts = bench.run(key).snapshot()

    # "Not applied" right after a timeout is not a confirmed failure: the request may land.
    # Failed, its owner would send the operation again under a new key and charge twice.
    assert counts == {"reconciled.not_applied": 1, "settled.unknown": 1}
    row = bench.row(key)
    assert (row["state"], row["outcome_code"]) == ("unknown", "provider_timeout")
    assert "may still land" in row["outcome_detail"]
    eventually(lambda: provider.late() == 0, "the timed-out request to land")
    assert provider.charges_for(ikey) == 1

    # The unknown runbook: a redrive, whose next claim looks the key up and finds the charge.
    bench.store.operator.redrive(RedriveFilter(keys=(key,)), actor="on-call", reason="INC-2")
    assert bench.run(key).snapshot() == {"reconciled.applied": 1, "settled.succeeded": 1}
    (charge,) = provider.ledger()
    assert bench.row(key)["outcome_detail"] == charge.id
    assert provider.requests_for(ikey) == 1


def test_class_c_retry_on_the_last_attempt_after_an_ambiguous_one_is_unknown_not_failed(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.C, max_attempts=2)
    handler.outcomes["op"] = Ambiguous("timeout")
    key = bench.ingest("scripted", "op")
    assert bench.run(key).snapshot() == {"reconciled.not_applied": 1, "settled.queued": 1}
    bench.clock.advance(PAST_ANY_BACKOFF)
    # The last attempt finds nothing either and is told to retry ("still in flight"): the first
    # request may still land, so there is no confirmed failure to report.
    handler.outcomes["op"] = RetryLater("provider_in_progress")

    assert bench.run(key).snapshot() == {"reconciled.not_applied": 1, "settled.unknown": 1}
    assert bench.outcome(key) == (UNKNOWN, "provider_in_progress")


def test_class_c_retry_on_the_last_attempt_of_a_row_that_never_sent_anything_is_failed(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.C, max_attempts=1)
    handler.outcomes["op"] = RetryLater("provider_in_progress")
    key = bench.ingest("scripted", "op")
    # The only request there ever was answered with an explicit refusal: nothing can land.
    assert bench.run(key).snapshot() == {"settled.failed_terminal": 1}
    assert bench.outcome(key) == (FAILED, "attempts_exhausted")
    assert handler.looked_up == []


def test_class_c_key_in_flight_elsewhere_is_retried_later(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    provider.set_fault(FaultKind.SLOW, key=ikey, seconds=5)
    slow = PaymentClient(provider.url, timeout=30)
    earlier = threading.Thread(target=slow.charge, args=(ikey, CHARGE))

    def in_flight() -> bool:
        try:
            charges.lookup(ikey)
        except ProviderConflict:
            return True
        return False

    earlier.start()
    try:
        # The provider holds the key for the fault's five seconds only.
        eventually(in_flight, "the earlier request to reach the provider", timeout=10)
        counts = bench.run(key).snapshot()
    finally:
        provider.stop()  # releases the slow request at once
        earlier.join()

    assert counts == {"settled.queued": 1}
    assert bench.outcome(key) == (QUEUED, "provider_in_progress")
    assert provider.charges_for(ikey) == 1


def test_class_c_key_used_with_another_body_is_a_terminal_failure(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    charges.charge(ikey, {**CHARGE, "amount": 999})

    bench.run(key)

    assert bench.outcome(key) == (FAILED, "idempotency_error")
    assert provider.charges_for(ikey) == 1


def test_class_c_lookup_that_finds_another_charge_under_the_key_cannot_tell(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = key_of(bench, key)
    bench.store.settle.record_intent(bench.claim(key).ticket)
    charges.charge(ikey, {**CHARGE, "amount": 999})
    bench.lapse()

    bench.run(key)

    assert bench.outcome(key) == (UNKNOWN, "reconcile_failed")


def test_class_c_invalid_payload_is_quarantined_without_a_request(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", {"amount": "12.00", "currency": "eur"})
    bench.run(key)
    assert bench.outcome(key) == (QUARANTINED, "invalid_payload")
    assert provider.requests_for(key_of(bench, key)) == 0


# -- classes C and D: once the call may have left, only an explicit outcome counts ---------------

#: what a client raises when the target answered and the answer could not be read: a missing
#: field, a malformed value, a body that is not JSON. None of them says the effect did not happen.
MISREAD: dict[str, Callable[[], BaseException]] = {
    "value-error": lambda: ValueError("invalid literal for int() with base 10: 'ch_'"),
    "key-error": lambda: KeyError("id"),
    "json-error": lambda: json.JSONDecodeError("Expecting value", "<html>", 0),
}


class ChargeThenMisread(payments.ChargeCustomer):
    """The demo charge, whose client then fails on the provider's answer, as scripted.

    ``after``: raise once the provider has answered (the charge is in its ledger). ``before``:
    raise inside ``perform`` before any request is made (nothing is in the ledger).
    """

    def __init__(self, client: PaymentClient) -> None:
        super().__init__(client)
        self.after: dict[str, BaseException] = {}
        self.before: dict[str, BaseException] = {}
        self.invalid: dict[str, BaseException] = {}

    def validate(self, ctx: Context) -> None:
        if ctx.operation_id in self.invalid:
            raise self.invalid.pop(ctx.operation_id)

    def perform(self, ctx: Context, key: str) -> Success:
        if ctx.operation_id in self.before:
            raise self.before.pop(ctx.operation_id)
        charged = super().perform(ctx, key)
        if ctx.operation_id in self.after:
            raise self.after.pop(ctx.operation_id)
        return charged


@pytest.fixture
def misread(bench: Bench, provider: PaymentProvider) -> ChargeThenMisread:
    handler = ChargeThenMisread(PaymentClient(provider.url, timeout=0.5))
    bench.register(payments.JOB_TYPE, handler)
    return handler


@pytest.mark.parametrize("error", sorted(MISREAD))
def test_class_c_error_after_the_provider_applied_is_looked_up_and_succeeds(
    bench: Bench, misread: ChargeThenMisread, provider: PaymentProvider, error: str
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    misread.after["charge-1"] = MISREAD[error]()

    counts = bench.run(key).snapshot()

    # Not failed_terminal (whose owner would charge again) nor quarantined: looked up, found.
    assert counts == {"reconciled.applied": 1, "settled.succeeded": 1}
    assert bench.outcome(key) == (SUCCEEDED, "charged")
    ikey = key_of(bench, key)
    (charge,) = provider.ledger()
    assert charge.idempotency_key == ikey
    assert bench.row(key)["outcome_detail"] == charge.id
    assert (provider.charges_for(ikey), provider.lookups_for(ikey)) == (1, 1)


@pytest.mark.parametrize("error", sorted(MISREAD))
def test_class_c_error_inside_perform_before_the_request_is_looked_up_and_charged_once_later(
    bench: Bench, misread: ChargeThenMisread, provider: PaymentProvider, error: str
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    misread.before["charge-1"] = MISREAD[error]()

    assert bench.run(key).snapshot() == {"reconciled.not_applied": 1, "settled.queued": 1}
    assert bench.outcome(key) == (QUEUED, type(MISREAD[error]()).__name__)
    assert provider.ledger() == []

    bench.clock.advance(PAST_ANY_BACKOFF)
    # The next claim looks up first (attempts > 1), finds nothing and charges, once.
    assert bench.run(key).snapshot() == {"reconciled.not_applied": 1, "settled.succeeded": 1}
    assert bench.outcome(key) == (SUCCEEDED, "charged")
    assert provider.charges_for(key_of(bench, key)) == 1


def test_class_c_errors_in_validate_keep_the_table_and_send_nothing(
    bench: Bench, misread: ChargeThenMisread, provider: PaymentProvider
) -> None:
    cases = {
        "bad-value": (ValueError("amount"), (FAILED, "ValueError")),
        "missing": (KeyError("amount"), (FAILED, "KeyError")),
        "unreadable": (json.JSONDecodeError("bad", "{", 0), (QUARANTINED, "JSONDecodeError")),
        "unexpected": (RuntimeError("boom"), (QUEUED, "RuntimeError")),
    }
    keys = {}
    for name, (error, _) in cases.items():
        misread.invalid[name] = error
        keys[name] = bench.ingest(payments.JOB_TYPE, name, CHARGE)

    for key in keys.values():
        assert bench.run(key).snapshot().keys() == {f"settled.{bench.outcome(key)[0].value}"}

    assert {n: bench.outcome(k) for n, k in keys.items()} == {n: c[1] for n, c in cases.items()}
    assert provider.ledger() == []
    assert sum(provider.lookups_for(key_of(bench, k)) for k in keys.values()) == 0


def test_class_c_unreadable_payload_read_inside_perform_is_still_quarantined(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    """ctx.json() failing is about the input, not the provider's answer: no lookup, no guess."""
    (result,) = bench.store.inbox.ingest(
        [replace(bench.delivery(payments.JOB_TYPE, "charge-1"), payload=b"{not json")]
    )
    key = result.key
    assert key is not None

    assert bench.run(key).snapshot() == {"settled.quarantined": 1}
    assert bench.outcome(key) == (QUARANTINED, "JSONDecodeError")
    ikey = key_of(bench, key)
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (0, 0)


@pytest.mark.parametrize("error", sorted(MISREAD))
def test_class_d_error_after_the_call_is_unknown_and_never_called_again(
    bench: Bench, error: str
) -> None:
    handler = scripted(bench, TargetClass.D)
    handler.outcomes["op"] = MISREAD[error]()
    key = bench.ingest("scripted", "op")

    assert bench.run(key).snapshot() == {"settled.unknown": 1}

    row = bench.row(key)
    code = type(MISREAD[error]()).__name__
    assert (row["state"], row["outcome_code"], row["intent_fence"]) == ("unknown", code, 1)
    assert row["outcome_detail"] == "ambiguous result from an unfenced target"
    # A redrive sends it back, and the next claim finds the intent: still no second call.
    bench.store.operator.redrive(RedriveFilter(keys=(key,)), actor="on-call", reason="INC-1")
    handler.outcomes["op"] = None
    assert bench.run(key).snapshot() == {"settled.unknown": 1}
    assert bench.outcome(key) == (UNKNOWN, "intent_recorded")
    assert handler.calls == [("op", 1)]


def test_class_d_wrong_return_value_after_the_call_is_unknown_not_failed(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.D)
    handler.outcomes["odd"] = lambda: cast(Any, {"status": "sent"})  # the call happened
    key = bench.ingest("scripted", "odd")
    bench.run(key)
    assert bench.outcome(key) == (UNKNOWN, "TypeError")


# -- class D: at most one call -------------------------------------------------------------------


def test_class_d_validation_failures_never_call_and_record_no_intent(bench: Bench) -> None:
    handler = scripted(bench, TargetClass.D)
    cases = {
        "refused": (TerminalFailure("not_allowed"), (FAILED, "not_allowed")),
        "bad-value": (ValueError("no recipient"), (FAILED, "ValueError")),
        "unreadable": (json.JSONDecodeError("bad", "{", 0), (QUARANTINED, "JSONDecodeError")),
        "quarantine": (Quarantine("unknown_schema"), (QUARANTINED, "unknown_schema")),
    }
    for name, (error, _) in cases.items():
        handler.invalid[name] = error
        handler.outcomes[name] = None
    keys = {name: bench.ingest("scripted", name) for name in cases}

    for key in keys.values():
        bench.run(key)

    assert {n: bench.outcome(k) for n, k in keys.items()} == {n: c[1] for n, c in cases.items()}
    assert handler.calls == []
    assert {bench.row(k)["intent_fence"] for k in keys.values()} == {None}


def test_class_d_intent_found_by_a_later_claim_parks_unknown_without_calling(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.D)
    handler.outcomes["op"] = Ambiguous("no_answer")
    key = bench.ingest("scripted", "op")

    bench.run(key)

    assert bench.outcome(key) == (UNKNOWN, "no_answer")
    assert handler.calls == [("op", 1)]
    bench.store.operator.redrive(
        RedriveFilter(keys=(key,)), actor="on-call", reason="retry the call"
    )
    handler.outcomes["op"] = None

    assert bench.run(key).snapshot() == {"settled.unknown": 1}

    row = bench.row(key)
    assert (row["state"], row["outcome_code"], row["fence"]) == ("unknown", "intent_recorded", 2)
    assert handler.calls == [("op", 1)], "called once, ever"


def test_class_d_rows_written_claimed_for_a_process_that_died_are_queued_again_and_called_once(
    bench: Bench,
) -> None:
    handler = scripted(bench, TargetClass.D)
    batch = [bench.delivery("scripted", op) for op in ("op-1", "op-2", "op-3")]
    for op in ("op-1", "op-2", "op-3"):
        handler.outcomes[op] = None
    # The inbox wrote them claimed for its pool (the hand-off), then the process died: one of
    # its workers had recorded its intent and was calling, the others had not started.
    claimed = {
        r.key.operation_id: r.claim
        for r in bench.store.inbox.ingest(batch, InsertClaim("dead", {"scripted": LEASE}, 3))
    }
    assert {op: c.fence for op, c in claimed.items() if c is not None} == {
        "op-1": 1,
        "op-2": 1,
        "op-3": 1,
    }
    called = claimed["op-3"]
    assert called is not None
    bench.store.settle.record_intent(called.ticket)
    bench.lapse()

    swept = bench.store.settle.sweep()

    assert swept.parked == [Ticket(TENANT, "op-3", 1)]
    assert set(swept.requeued) == {Ticket(TENANT, "op-1", 1), Ticket(TENANT, "op-2", 1)}
    for op in ("op-1", "op-2"):
        assert bench.run(Key(TENANT, op)).snapshot() == {"settled.succeeded": 1}
        assert bench.outcome(Key(TENANT, op)) == (SUCCEEDED, "ok")
    assert bench.outcome(Key(TENANT, "op-3")) == (UNKNOWN, "lease_expired_attempts_exhausted")
    # Called once each, under the fence of the claim that recorded the intent; never op-3.
    assert sorted(handler.calls) == [("op-1", 2), ("op-2", 2)]


# -- the last attempt's lease expires: the sweeper parks it, nobody guesses ----------------------


@pytest.mark.parametrize(
    "target", [TargetClass.B, TargetClass.C, TargetClass.D], ids=lambda t: f"class-{t.value}"
)
def test_a_last_attempt_that_outlives_its_lease_is_unknown_whatever_it_returns(
    bench: Bench, target: TargetClass
) -> None:
    handler = scripted(bench, target, max_attempts=1)
    returns: dict[str, Outcome] = {
        "success": None,
        "terminal": TerminalFailure("refused"),
        "retry": RetryLater("busy"),
    }
    swept: list[Ticket] = []

    def slow_then(outcome: Outcome) -> Callable[[], Success | None]:
        def run() -> Success | None:
            bench.lapse()  # the handler took longer than its lease ...
            swept.extend(bench.store.settle.sweep().parked)  # ... and the sweeper ran meanwhile
            return act(outcome)

        return run

    keys = {}
    for name, outcome in returns.items():
        handler.outcomes[name] = slow_then(outcome)
        keys[name] = bench.ingest("scripted", name)

    for key in keys.values():
        assert bench.run(key).snapshot() == {"lease_lost": 1}

    assert sorted(t.operation_id for t in swept) == sorted(keys)
    for key in keys.values():
        assert bench.outcome(key) == (UNKNOWN, "lease_expired_attempts_exhausted")


# -- seed tests 3 and 4 at executor level --------------------------------------------------------


def test_a_replayed_delivery_of_a_succeeded_operation_runs_nothing(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    bench.run(key)
    assert bench.outcome(key) == (SUCCEEDED, "charged")
    before = bench.row(key)

    replay = bench.store.inbox.ingest([bench.delivery(payments.JOB_TYPE, "charge-1", CHARGE)])
    changed = {**CHARGE, "amount": 5000}
    conflict = bench.store.inbox.ingest([bench.delivery(payments.JOB_TYPE, "charge-1", changed)])

    assert replay == [IngestResult(Decision.REPLAY, key, State.SUCCEEDED)]
    assert conflict == [IngestResult(Decision.CONFLICT, key, State.SUCCEEDED)]
    bench.clock.advance(PAST_ANY_BACKOFF)
    assert bench.store.claims.claim("worker", 10, LEASE) == []
    assert bench.row(key) == before
    ikey = key_of(bench, key)
    assert (provider.charges_for(ikey), provider.requests_for(ikey)) == (1, 1)


def test_two_tenants_with_the_same_operation_id_act_independently(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    bench.register(invoices.JOB_TYPE, invoices.RefundInvoice())
    amounts = {"t1": 1200, "t2": 3400}
    for tenant, amount in amounts.items():
        invoices.add_invoice(bench.db, tenant, "inv-1", amount=amount)
        bench.ingest(payments.JOB_TYPE, "op-1", {**CHARGE, "amount": amount}, tenant=tenant)
        bench.ingest(invoices.JOB_TYPE, "refund-1", {"invoice_id": "inv-1"}, tenant=tenant)

    claims = bench.store.claims.claim("worker", 10, LEASE)
    assert len(claims) == 4
    for claim in claims:
        bench.execute(claim)

    keys = {t: bench.hasher.idempotency_key(t, "op-1") for t in amounts}
    assert keys["t1"] != keys["t2"]
    assert {c.idempotency_key: c.amount for c in provider.ledger()} == {
        keys[t]: amount for t, amount in amounts.items()
    }
    for tenant, amount in amounts.items():
        assert bench.outcome(Key(tenant, "op-1")) == (SUCCEEDED, "charged")
        assert bench.outcome(Key(tenant, "refund-1")) == (SUCCEEDED, "refunded")
        found = invoices.find_invoice(bench.db, tenant, "inv-1")
        assert found is not None
        assert (found.status, found.amount, found.refunded_fence) == ("refunded", amount, 1)
