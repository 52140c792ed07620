"""The demo payment provider's rules, without a server: body identity, validation, faults."""

from __future__ import annotations

import pytest

from bridge.demo.provider import (
    ChargeResult,
    Fault,
    FaultKind,
    PaymentClient,
    PaymentProvider,
    canonical_hash,
    charge_error,
)


def test_canonical_hash_ignores_key_order_and_whitespace() -> None:
    a = {"amount": 1200, "currency": "eur", "meta": {"x": 1, "y": [1, 2]}}
    b = {"meta": {"y": [1, 2], "x": 1}, "currency": "eur", "amount": 1200}
    assert canonical_hash(a) == canonical_hash(b)


@pytest.mark.parametrize(
    "other",
    [
        {"amount": 1201, "currency": "eur"},
        {"amount": 1200, "currency": "EUR"},
        {"amount": 1200, "currency": "eur", "reference": None},
        {"amount": 1200.0, "currency": "eur"},
    ],
)
def test_canonical_hash_sees_every_difference(other: dict[str, object]) -> None:
    assert canonical_hash({"amount": 1200, "currency": "eur"}) != canonical_hash(other)


def test_a_valid_charge_body() -> None:
    assert charge_error({"amount": 1, "currency": "usd"}) is None
    assert charge_error({"amount": 1, "currency": "usd", "reference": None}) is None
    assert charge_error({"amount": 1, "currency": "usd", "extra": [1]}) is None


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ([], "object"),
        ({"currency": "eur"}, "amount"),
        ({"amount": False, "currency": "eur"}, "amount"),
        ({"amount": 1, "currency": "e1r"}, "currency"),
        ({"amount": 1, "currency": "eur", "reference": 3}, "reference"),
    ],
)
def test_an_invalid_charge_body_says_why(body: object, word: str) -> None:
    problem = charge_error(body)
    assert problem is not None
    assert word in problem


def test_fault_defaults() -> None:
    assert Fault(FaultKind.SLOW).delay == 1.0
    assert Fault(FaultKind.APPLY_THEN_TIMEOUT).delay == 10.0
    assert Fault(FaultKind.APPLY_THEN_TIMEOUT, seconds=0.5).delay == 0.5
    assert Fault.from_json({"kind": "reset_after_apply"}) == Fault(FaultKind.RESET_AFTER_APPLY)


def test_fault_json_round_trip() -> None:
    fault = Fault(FaultKind.SLOW, times=3, key="k", seconds=0.25)
    assert Fault.from_json(fault.to_json()) == fault


@pytest.mark.parametrize(
    "kwargs",
    [
        {"times": 0},
        {"times": True},
        {"seconds": 0},
        {"seconds": "1"},
        {"key": 5},
    ],
)
def test_set_fault_refuses_nonsense(kwargs: dict[str, object]) -> None:
    (field,) = kwargs  # the message names the field that is wrong
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        PaymentProvider().set_fault(FaultKind.SLOW, **kwargs)  # type: ignore[arg-type]


def test_seconds_belongs_to_timed_faults_only() -> None:
    with pytest.raises(ValueError, match="seconds does not apply"):
        PaymentProvider().set_fault("reset_before_apply", seconds=1)
    with pytest.raises(ValueError, match="explode"):
        PaymentProvider().set_fault("explode")


def test_charge_result_refuses_a_body_that_is_not_a_charge() -> None:
    with pytest.raises(ValueError, match="amount"):
        ChargeResult.from_json(
            b'{"id": "ch_1", "amount": "12", "currency": "eur", "status": "succeeded",'
            b' "idempotency_key": "k", "reference": null}'
        )


def test_the_client_speaks_http_only() -> None:
    with pytest.raises(ValueError, match="http://"):
        PaymentClient("https://127.0.0.1:1")
