"""The job registry refuses, at registration, what could only fail later (or never loudly)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bridge.config import parse_config
from bridge.database import Connection
from bridge.errors import ConfigError
from bridge.executors.registry import LEASE_DEFAULT, Registry, build_job
from bridge.handlers import (
    Applied,
    ConditionalWriteHandler,
    Context,
    Handler,
    IdempotentApiHandler,
    NotApplied,
    RetryPolicy,
    SameDatabaseHandler,
    Success,
    UnfencedHandler,
)
from bridge.types import TargetClass
from tests.unit.test_config import BASE


class Refund(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> Success | None:
        return None


class Write(ConditionalWriteHandler):
    def handle(self, ctx: Context) -> Success | None:
        return None


class Charge(IdempotentApiHandler):
    def perform(self, ctx: Context, key: str) -> Success | None:
        return None

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        return NotApplied()


class Notify(UnfencedHandler):
    def call(self, ctx: Context) -> Success | None:
        return None


class Homemade(Handler):
    """Extends the common base directly: no executor knows what it promises."""

    target_class = TargetClass.B
    guarantee = "whatever it says"


ONE = RetryPolicy(max_attempts=1)


@pytest.mark.parametrize(
    ("handler", "target"),
    [(Refund(), "A"), (Write(), "B"), (Charge(), "C"), (Notify(), "D")],
)
def test_the_base_class_decides_the_target_class(handler: Handler, target: str) -> None:
    retry = ONE if target == "D" else None
    spec = Registry().register("job", handler, retry=retry)
    assert spec.target_class is TargetClass(target)
    assert spec.handler is handler
    assert spec.lease == LEASE_DEFAULT


def test_a_registered_spec_is_found_by_job_type() -> None:
    registry = Registry()
    spec = registry.register("refund", Refund(), lease=timedelta(seconds=5))
    registry.register("charge", Charge(), retry=RetryPolicy(max_attempts=3))
    assert registry["refund"] is spec
    assert registry.get("missing") is None
    assert "charge" in registry
    assert "missing" not in registry
    assert registry.job_types == ["charge", "refund"]
    assert [s.job_type for s in registry.specs()] == ["charge", "refund"]
    assert registry["charge"].retry.max_attempts == 3


@pytest.mark.parametrize("attempts", [2, 5])
def test_class_d_with_more_than_one_attempt_is_refused(attempts: int) -> None:
    with pytest.raises(ConfigError) as refused:
        Registry().register("notify", Notify(), retry=RetryPolicy(max_attempts=attempts))
    message = str(refused.value)
    assert "'notify'" in message
    assert "class D" in message
    assert "max_attempts = 1" in message
    assert f"not {attempts}" in message


def test_class_d_with_the_default_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most one attempt"):
        Registry().register("notify", Notify())


def test_a_declared_class_that_does_not_match_the_handler_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        Registry().register("refund", Write(), declared_class=TargetClass.A)
    assert str(refused.value) == (
        "job type 'refund': declared target class A, but Write is a class B handler"
    )


def test_a_declared_class_that_matches_is_accepted() -> None:
    spec = Registry().register("refund", Refund(), declared_class=TargetClass.A)
    assert spec.target_class is TargetClass.A


@pytest.mark.parametrize(
    "handler", [object(), "refund", lambda ctx: None, Homemade()], ids=lambda h: type(h).__name__
)
def test_anything_but_one_of_the_four_bases_is_refused(handler: object) -> None:
    with pytest.raises(ConfigError) as refused:
        Registry().register("job", handler)  # type: ignore[arg-type]
    message = str(refused.value)
    for base in ("SameDatabaseHandler", "ConditionalWriteHandler", "IdempotentApiHandler"):
        assert base in message
    assert "UnfencedHandler" in message
    assert f"not {type(handler).__name__}" in message


def test_a_job_type_registered_twice_is_refused() -> None:
    registry = Registry()
    registry.register("refund", Refund())
    with pytest.raises(ConfigError, match="'refund' is registered twice"):
        registry.register("refund", Refund())


def test_fewer_than_one_attempt_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_attempts must be at least 1"):
        Registry().register("refund", Refund(), retry=RetryPolicy(max_attempts=0))


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-1)])
def test_a_lease_that_is_not_positive_is_refused(lease: timedelta) -> None:
    with pytest.raises(ConfigError, match="the lease must be positive"):
        Registry().register("refund", Refund(), lease=lease)


def test_a_rate_limit_wait_is_capped_at_fifteen_minutes_unless_the_job_sets_its_own() -> None:
    registry = Registry()
    assert registry.register("refund", Refund()).rate_wait_max == timedelta(minutes=15)
    capped = registry.register("charge", Charge(), rate_wait_max=timedelta(seconds=30))
    assert capped.rate_wait_max == timedelta(seconds=30)
    with pytest.raises(ConfigError, match="the longest rate limit wait must be > 0"):
        registry.register("write", Write(), rate_wait_max=timedelta(0))


def test_the_configured_maximum_wait_reaches_the_job_spec() -> None:
    text = BASE.replace("[jobs.refund]\n", "[jobs.refund]\nrate_limit_wait_max_seconds = 120\n")
    loaded = parse_config(text)
    spec = build_job(loaded, "refund", Registry(), Charge())
    assert spec.rate_wait_max == timedelta(minutes=2)


def test_a_refused_registration_leaves_the_registry_unchanged() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="at most one attempt"):
        registry.register("notify", Notify())
    assert "notify" not in registry
    registry.register("notify", Notify(), retry=ONE)  # the name is still free
    assert registry.job_types == ["notify"]
