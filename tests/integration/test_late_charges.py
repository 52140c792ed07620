"""Class C at volume with requests that time out and land late: each charge at most once.

A worker pool on real PostgreSQL runs 1,000 charges of the demo handler against the payment
provider over HTTP, with two attempts each. The handler's client retries a request once after a
timeout, as many SDKs do. The batch carries duplicate deliveries and conflicting ones; the
provider resets connections after applying some charges, and for two groups of operations it
holds requests on their way:

* **late**: every request of the operation times out and stays on its way until the test lets
  it land, after both attempts are over: the lookups right after each timeout find nothing.
  The last attempt's "not applied" is no confirmed failure, so the row is parked ``unknown``
  with the reason, never ``failed_terminal``: its owner would send the operation again under a
  new key (the test does, for every failed row), and the late request would charge a second
  time. Once the requests have landed, the unknown runbook's redrive finds every charge.
* **limited**: the first request times out and lands a moment later, the client's retry is
  answered 429 with a ``Retry-After`` of an hour, which the job type's maximum wait cuts to two
  seconds (counted). The rate limit gives the attempt back, but the call had left: the next
  claim looks the key up first and finds the charge, with no third request.

Whatever the mix, every operation ends ``succeeded`` and every order is charged exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.demo import payments
from bridge.demo.provider import FaultKind, PaymentClient, PaymentProvider, ProviderTimeout
from bridge.executors.registry import Registry
from bridge.handlers import Ambiguous, Applied, Context, NotApplied, RetryPolicy, Success
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.types import Decision, Delivery, Key, RedriveFilter, State
from tests.support.deliveries import for_job
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]


HASHER = IdentityHasher(b"late-charge-tests-identity-secret")
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
RESETS = 25
#: every 20th operation's requests land only when the test lets them (after both attempts)
LATE = range(3, OPERATIONS, 20)
#: every 20th operation (another tenant's): a request that lands late, then a 429
LIMITED = range(13, OPERATIONS, 20)
LIMITED_TENANT = "t2"
#: two attempts of two requests each (the client's retry): every one of them held
LATE_REQUESTS = 4
HOLD_SECONDS = 600.0
TIMEOUT_SECONDS = 0.3
LOOKUP_TIMEOUT_SECONDS = 10.0
#: the job type's longest rate limit wait: the provider's hour is cut to it
RATE_WAIT_MAX = timedelta(seconds=2)
SETTLE_TIMEOUT = 120.0


class SdkCharge(payments.ChargeCustomer):
    """The demo charge behind a client that sends a request once more after a timeout.

    Lookups go through a client with a longer timeout: the test is about charges that land
    late, and a lookup that times out on a loaded machine is an honest "cannot tell" that parks
    the row ``unknown`` after its first attempt, before the second attempt's requests are sent.
    """

    def __init__(self, client: PaymentClient, lookups: PaymentClient) -> None:
        super().__init__(client)
        self._lookups = payments.ChargeCustomer(lookups)

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        return self._lookups.lookup(ctx, key)

    def perform(self, ctx: Context, key: str) -> Success:
        try:
            return super().perform(ctx, key)
        except Ambiguous as exc:
            if not isinstance(exc.__cause__, ProviderTimeout):
                raise
            return super().perform(ctx, key)


def tenant_of(i: int) -> str:
    return LIMITED_TENANT if i in LIMITED else "t1"


def order(i: int) -> dict[str, object]:
    return {"amount": 100 + i, "currency": "eur", "reference": f"order-{i:04d}"}


def states(db: Db) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {s: int(n) for s, n in rows}


def open_rows(db: Db) -> int:
    row = db.execute(
        "SELECT count(*) FROM work_item WHERE state IN ('queued', 'claimed')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def ingest(store: PostgresStore, batch: list[Delivery]) -> Counter[Decision]:
    decisions: Counter[Decision] = Counter()
    for start in range(0, len(batch), 100):
        decisions.update(r.decision for r in store.inbox.ingest(batch[start : start + 100]))
    return decisions


@pytest.fixture
def provider() -> Iterator[PaymentProvider]:
    with PaymentProvider() as p:
        yield p


@pytest.fixture
def registry(provider: PaymentProvider) -> Registry:
    registry = Registry()
    registry.register(
        payments.JOB_TYPE,
        SdkCharge(
            PaymentClient(provider.url, timeout=TIMEOUT_SECONDS),
            PaymentClient(provider.url, timeout=LOOKUP_TIMEOUT_SECONDS),
        ),
        retry=RetryPolicy(
            max_attempts=2,
            backoff_initial=timedelta(milliseconds=50),
            backoff_max=timedelta(milliseconds=100),
        ),
        rate_wait_max=RATE_WAIT_MAX,
    )
    return registry


@pytest.fixture
def pool(store: PostgresStore, registry: Registry) -> Iterator[WorkerPool]:
    running = WorkerPool(store, registry, HASHER, threads=8, poll_interval=0.05)
    running.start()
    yield running
    running.stop(deadline=10)


@pytest.mark.slow
def test_requests_landing_late_leave_every_order_charged_exactly_once(
    store: PostgresStore, db: Db, provider: PaymentProvider, registry: Registry, pool: WorkerPool
) -> None:
    key = {i: HASHER.idempotency_key(tenant_of(i), f"op-{i:04d}") for i in range(OPERATIONS)}
    for i in LATE:
        provider.set_fault(
            FaultKind.LATE_APPLY, key=key[i], times=LATE_REQUESTS, seconds=HOLD_SECONDS
        )
    for i in LIMITED:
        provider.set_fault(FaultKind.LATE_APPLY, key=key[i], seconds=0.5)
        provider.set_fault(FaultKind.RATE_LIMITED, key=key[i], retry_after="3600")
    provider.set_fault(FaultKind.RESET_AFTER_APPLY, times=RESETS)  # any other request

    def delivery(i: int, payload: dict[str, object]) -> Delivery:
        job = payments.JOB_TYPE
        return for_job(registry, job, f"op-{i:04d}", payload, tenant=tenant_of(i))

    firsts = [delivery(i, order(i)) for i in range(OPERATIONS)]
    decisions = ingest(store, [*firsts, *firsts[:DUPLICATES]])
    conflicts = ingest(store, [delivery(i, {**order(i), "amount": 999}) for i in range(CONFLICTS)])

    eventually(lambda: open_rows(db) == 0, "every attempt to end", timeout=SETTLE_TIMEOUT)
    ended = states(db)
    # What a failed row's owner does: the order again, as a new operation (a new key).
    failed = db.execute(
        "SELECT operation_id, tenant_id FROM work_item WHERE state = 'failed_terminal'"
    ).fetchall()
    again = [
        for_job(registry, payments.JOB_TYPE, f"{op}-again", order(int(op[3:])), tenant=t)
        for op, t in failed
    ]
    if again:
        ingest(store, again)
        eventually(lambda: open_rows(db) == 0, "the owner's new operations", timeout=60)

    parked = db.execute(
        "SELECT operation_id, outcome_code, outcome_detail FROM work_item"
        " WHERE state = 'unknown' ORDER BY operation_id"
    ).fetchall()
    provider.release_late()  # the requests on their way land now
    eventually(lambda: provider.late() == 0, "the late requests to land", timeout=30)

    # The unknown runbook: redrive; each next claim looks its key up and finds the charge.
    moved = store.operator.redrive(
        RedriveFilter(states=(State.UNKNOWN,)), actor="on-call", reason="INC-38 late charges"
    )
    eventually(lambda: open_rows(db) == 0, "the redriven rows to settle", timeout=SETTLE_TIMEOUT)
    ledger = provider.ledger()
    counts = pool.counts.snapshot()

    assert decisions == {Decision.NEW: OPERATIONS, Decision.REPLAY: DUPLICATES}
    assert conflicts == {Decision.CONFLICT: CONFLICTS}
    assert [f for f in provider.faults() if f.kind is not FaultKind.RESET_AFTER_APPLY] == []
    by_order = Counter(c.reference for c in ledger)
    twice = sorted(r for r, n in by_order.items() if n > 1)
    assert twice == [], f"{len(twice)} orders charged twice, e.g. {twice[:3]}"
    assert len(ledger) == OPERATIONS
    assert failed == [], "a failed row whose request may still land invites a second charge"
    assert states(db) == {"succeeded": OPERATIONS}
    assert ended == {"succeeded": OPERATIONS - len(LATE), "unknown": len(LATE)}
    assert {op for op, _, _ in parked} == {f"op-{i:04d}" for i in LATE}
    assert {code for _, code, _ in parked} == {"provider_timeout"}
    assert all("may still land" in detail for _, _, detail in parked)
    assert {m.key for m in moved} == {Key("t1", f"op-{i:04d}") for i in LATE}
    for i in LATE:
        assert provider.requests_for(key[i]) == LATE_REQUESTS
    for i in LIMITED:
        # The late request, then the 429; the next claim found the charge by lookup.
        assert provider.requests_for(key[i]) == 2, f"op-{i:04d}"
        assert provider.lookups_for(key[i]) >= 1, f"op-{i:04d}"
    assert counts["reconciled.applied"] >= len(LIMITED) + len(LATE)
    assert "settled.failed_terminal" not in counts
    assert counts["rate_wait_clamped"] == len(LIMITED)
    history = db.execute(
        "SELECT outcome_code, count(*) FROM work_attempt WHERE outcome = 'queued'"
        " GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert dict(history)["rate_limited"] == len(LIMITED)
