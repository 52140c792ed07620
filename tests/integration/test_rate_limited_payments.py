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
from bridge.demo.provider import FaultKind, PaymentClient, PaymentProvider, ProviderRateLimited
from bridge.handlers import RateLimited
from tests.integration.test_executors import (
    CHARGE,
    START,
    TENANT,
    Bench,
    bench,
    charges,
    provider,
)
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
    assert bench.store.claim_keys("w", [limited, sibling], LEASE) == []
    assert bench.run(other).snapshot() == {"settled.succeeded": 1}  # t2 is not limited

    bench.clock.advance(timedelta(seconds=2))
    for key in (limited, sibling):
        claim = bench.claim(key)
        assert claim.attempts == 1
        assert bench.execute(claim).snapshot() == {"settled.succeeded": 1}
    assert len(provider.ledger()) == 3
    assert provider.charges_for(bench.hasher.idempotency_key(TENANT, "charge-1")) == 1
