"""The demo charge handler against the provider stand-in over HTTP: a 429 is a rate limit.

The provider answers 429 with ``Retry-After`` before looking at the key, so nothing is charged;
the handler raises RateLimited with the header's wait, and the executor parks the charge type
of that tenant for as long, without using an attempt.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from bridge.demo import payments
from bridge.demo.provider import (
    FaultKind,
    PaymentClient,
    PaymentProvider,
    ProviderRateLimited,
    ProviderTimeout,
)
from bridge.handlers import Ambiguous, Context, RateLimited, Success
from tests.integration.test_executors import (
    CHARGE,
    START,
    TENANT,
    Bench,
    bench,
    charges,
    provider,
)
from tests.support.waiting import eventually
from tests.support.worker_process import context_for

__all__ = ["bench", "charges", "provider"]  # fixtures, imported for these tests

LEASE = timedelta(seconds=30)


def test_the_client_reports_a_429_with_its_retry_after_and_nothing_is_charged(
    provider: PaymentProvider,
) -> None:
    client = PaymentClient(provider.url, timeout=5)
    provider.set_fault(FaultKind.RATE_LIMITED, retry_after="2")
    with pytest.raises(ProviderRateLimited) as raised:
        client.charge("key-1", CHARGE)
    assert (raised.value.status, raised.value.retry_after) == (429, "2")
    assert provider.ledger() == []
    assert client.lookup("key-1") is None  # the key was never looked at, so it stays free
    assert client.charge("key-1", CHARGE).replayed is False
    assert provider.charges_for("key-1") == 1


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("2", timedelta(seconds=2)),
        (None, payments.RETRY_AFTER_DEFAULT),
        ("not a number", payments.RETRY_AFTER_DEFAULT),
        ("86400", payments.RETRY_AFTER_MAX),
    ],
)
def test_the_handler_maps_a_429_to_rate_limited_with_the_header_wait(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider, header: str | None, wait: Any
) -> None:
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    claim = bench.claim(key)
    provider.set_fault(FaultKind.RATE_LIMITED, retry_after=header)
    handler = payments.ChargeCustomer(charges)
    ctx = context_for(claim, bench.hasher)
    with pytest.raises(RateLimited) as raised:
        handler.perform(ctx, ctx.idempotency_key)
    assert (raised.value.code, raised.value.retry_after) == ("rate_limited", wait)
    assert provider.ledger() == []


def test_a_429_parks_the_tenants_charges_for_the_wait_and_then_charges_once(
    bench: Bench, charges: PaymentClient, provider: PaymentProvider
) -> None:
    limited = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    sibling = bench.ingest(payments.JOB_TYPE, "charge-2", {**CHARGE, "reference": "order-2"})
    other = bench.ingest(payments.JOB_TYPE, "charge-3", CHARGE, tenant="t2")
    provider.set_fault(FaultKind.RATE_LIMITED, retry_after="2")

    assert bench.run(limited).snapshot() == {"settled.queued": 1}
    row = bench.row(limited)
    assert (row["state"], row["attempts"], row["outcome_code"]) == ("queued", 0, "rate_limited")
    assert row["next_attempt_at"] == START + timedelta(seconds=2)
    assert bench.store.claims.claim_keys("w", [limited, sibling], LEASE) == []
    assert bench.run(other).snapshot() == {"settled.succeeded": 1}  # t2 is not limited

    bench.clock.advance(timedelta(seconds=2))
    # The limited row's call left (its intent is recorded), so it looks its key up first.
    for key, first in ((limited, {"reconciled.not_applied": 1}), (sibling, {})):
        claim = bench.claim(key)
        assert claim.attempts == 1
        assert bench.execute(claim).snapshot() == {**first, "settled.succeeded": 1}
    assert len(provider.ledger()) == 3
    assert provider.charges_for(bench.hasher.idempotency_key(TENANT, "charge-1")) == 1


class RetryingCharge(payments.ChargeCustomer):
    """The demo charge behind a client that retries a request once after a timeout, as many
    SDKs do: the second request can be answered 429 while the first is still on its way."""

    def perform(self, ctx: Context, key: str) -> Success:
        try:
            return super().perform(ctx, key)
        except Ambiguous as exc:
            if not isinstance(exc.__cause__, ProviderTimeout):
                raise
            return super().perform(ctx, key)


def test_a_429_after_a_timed_out_request_is_looked_up_before_the_next_request(
    bench: Bench, provider: PaymentProvider
) -> None:
    bench.register(payments.JOB_TYPE, RetryingCharge(PaymentClient(provider.url, timeout=0.3)))
    key = bench.ingest(payments.JOB_TYPE, "charge-1", CHARGE)
    ikey = bench.hasher.idempotency_key(TENANT, "charge-1")
    provider.set_fault(FaultKind.LATE_APPLY, key=ikey, seconds=0.5)  # times out, lands later
    provider.set_fault(FaultKind.RATE_LIMITED, key=ikey, retry_after="2")  # the client's retry

    assert bench.run(key).snapshot() == {"settled.queued": 1}
    row = bench.row(key)
    # The 429 gave the attempt back, but the call had left: the intent stays recorded.
    assert (row["state"], row["attempts"], row["intent_fence"]) == ("queued", 0, 1)
    eventually(lambda: provider.late() == 0, "the timed-out request to land")
    assert provider.charges_for(ikey) == 1

    bench.clock.advance(timedelta(seconds=2))
    claim = bench.claim(key)
    assert (claim.attempts, claim.intent_fence) == (1, 1)
    # Looked up first, at attempt 1: found, settled without another request.
    assert bench.execute(claim).snapshot() == {"reconciled.applied": 1, "settled.succeeded": 1}
    (charge,) = provider.ledger()
    assert bench.row(key)["outcome_detail"] == charge.id
    assert (provider.requests_for(ikey), provider.lookups_for(ikey)) == (2, 1)
