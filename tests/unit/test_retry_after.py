"""Retry-After as the demo charge handler reads it: seconds or an HTTP-date, bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bridge.demo.payments import RETRY_AFTER_DEFAULT, RETRY_AFTER_MAX, retry_after
from bridge.demo.provider import Fault, FaultKind, PaymentProvider
from bridge.handlers import OutcomeKind, RateLimited

NOW = datetime(2024, 5, 6, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("2", timedelta(seconds=2)),
        (" 7 ", timedelta(seconds=7)),
        ("0", timedelta(0)),
        ("300", timedelta(seconds=300)),
        ("301", RETRY_AFTER_MAX),
        ("99999999999999999999", RETRY_AFTER_MAX),
        ("Mon, 06 May 2024 12:00:30 GMT", timedelta(seconds=30)),
        ("Mon, 06 May 2024 13:00:00 GMT", RETRY_AFTER_MAX),
        ("Mon, 06 May 2024 11:59:00 GMT", timedelta(0)),  # already past: due now
        ("Mon, 06 May 2024 12:00:05 -0000", timedelta(seconds=5)),
    ],
)
def test_seconds_and_dates_are_read_and_capped(header: str, wait: timedelta) -> None:
    assert retry_after(header, NOW) == wait


@pytest.mark.parametrize("header", [None, "", "  ", "-1", "1.5", "soon", "²", "Mon, 99 Foo"])
def test_a_missing_or_unreadable_header_waits_the_default(header: str | None) -> None:
    assert retry_after(header, NOW) == RETRY_AFTER_DEFAULT == timedelta(seconds=1)


def test_the_outcome_takes_a_timedelta_or_seconds_and_is_its_own_kind() -> None:
    assert RateLimited(retry_after=timedelta(seconds=3)).retry_after == timedelta(seconds=3)
    assert RateLimited(retry_after=2.5).retry_after == timedelta(seconds=2.5)
    assert RateLimited().retry_after == timedelta(seconds=1)
    assert RateLimited(retry_after=-3).retry_after == timedelta(0)
    assert (RateLimited().code, RateLimited.kind) == ("rate_limited", OutcomeKind.RATE_LIMITED)


def test_a_rate_limited_fault_carries_its_retry_after_through_json() -> None:
    fault = Fault(FaultKind.RATE_LIMITED, times=2, retry_after="Mon, 06 May 2024 12:00:30 GMT")
    assert Fault.from_json(fault.to_json()) == fault
    assert Fault.from_json({"kind": "rate_limited"}).retry_after == "1"
    assert Fault.from_json({"kind": "rate_limited", "retry_after": None}).retry_after is None
    assert "retry_after" not in Fault(FaultKind.SLOW).to_json()


def test_retry_after_belongs_to_the_rate_limited_fault_only() -> None:
    with pytest.raises(ValueError, match="retry_after does not apply"):
        PaymentProvider().set_fault("slow", retry_after="5")
    with pytest.raises(ValueError, match="retry_after must be a string"):
        Fault.from_json({"kind": "rate_limited", "retry_after": 5})
