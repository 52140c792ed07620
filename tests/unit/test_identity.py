"""Keyed hashes of identifiers: stable, tenant-scoped, opaque, separated by purpose."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.errors import ConfigError
from bridge.identity import IDEMPOTENCY_KEY_PREFIX, IDENTITY_KEY_ENV, IdentityHasher

SECRET = b"identity-unit-tests-secret-0001"
KEY_SHAPE = re.compile(r"^fb1_[a-z2-7]{48}$")

#: identifiers drawn from the key's own alphabet, so a leak could actually show up in a key
identifier = st.text(alphabet="abcdefghijklmnopqrstuvwxyz234567", min_size=8, max_size=40)
any_identifier = st.text(min_size=1, max_size=64)


@pytest.fixture
def hasher() -> IdentityHasher:
    return IdentityHasher(SECRET)


def test_idempotency_key_is_stable_across_instances_with_the_same_secret() -> None:
    one, two = IdentityHasher(SECRET), IdentityHasher(SECRET)
    assert one.idempotency_key("acme", "refund-42") == two.idempotency_key("acme", "refund-42")
    assert one.tenant("acme") == two.tenant("acme")
    assert one.operation("acme", "refund-42") == two.operation("acme", "refund-42")


def test_a_different_secret_derives_different_keys(hasher: IdentityHasher) -> None:
    other = IdentityHasher(SECRET + b"!")
    assert hasher.idempotency_key("acme", "op") != other.idempotency_key("acme", "op")


@given(tenant_a=any_identifier, tenant_b=any_identifier, operation=any_identifier)
def test_the_same_operation_id_in_two_tenants_gets_two_keys(
    tenant_a: str, tenant_b: str, operation: str
) -> None:
    hasher = IdentityHasher(SECRET)
    same = tenant_a == tenant_b
    assert (
        hasher.idempotency_key(tenant_a, operation) == hasher.idempotency_key(tenant_b, operation)
    ) is same
    assert (hasher.operation(tenant_a, operation) == hasher.operation(tenant_b, operation)) is same


def test_parts_are_length_prefixed_so_shifting_a_boundary_changes_the_key(
    hasher: IdentityHasher,
) -> None:
    assert hasher.idempotency_key("ab", "c") != hasher.idempotency_key("a", "bc")
    assert hasher.operation("ab", "c") != hasher.operation("a", "bc")


@given(tenant=any_identifier, operation=any_identifier)
def test_idempotency_key_has_a_fixed_length_and_alphabet(tenant: str, operation: str) -> None:
    key = IdentityHasher(SECRET).idempotency_key(tenant, operation)
    assert KEY_SHAPE.match(key), key
    assert len(key) == 52
    assert key.startswith(IDEMPOTENCY_KEY_PREFIX)


@given(tenant=identifier, operation=identifier)
def test_no_raw_identifier_appears_in_any_derived_form(tenant: str, operation: str) -> None:
    hasher = IdentityHasher(SECRET)
    derived = [
        hasher.idempotency_key(tenant, operation),
        hasher.tenant(tenant),
        hasher.operation(tenant, operation),
    ]
    for form in derived:
        assert tenant not in form
        assert operation not in form


def test_realistic_identifiers_do_not_leak(hasher: IdentityHasher) -> None:
    tenant, operation = "acme-payments", "refund-2024-000123"
    for form in (
        hasher.idempotency_key(tenant, operation),
        hasher.tenant(tenant),
        hasher.operation(tenant, operation),
    ):
        for part in (tenant, operation, "acme", "refund", "000123"):
            assert part not in form


def test_each_purpose_derives_an_unrelated_digest(hasher: IdentityHasher) -> None:
    key = hasher.idempotency_key("acme", "op-1")
    key_digest = base64.b32decode(key.removeprefix(IDEMPOTENCY_KEY_PREFIX).upper())
    operation_digest = bytes.fromhex(hasher.operation("acme", "op-1").removeprefix("op_"))
    tenant_digest = bytes.fromhex(hasher.tenant("acme").removeprefix("t_"))
    # Same secret, same identifiers, different purpose labels: no prefix is shared.
    assert key_digest[: len(operation_digest)] != operation_digest
    assert key_digest[: len(tenant_digest)] != tenant_digest
    assert operation_digest[: len(tenant_digest)] != tenant_digest
    assert hasher.tenant("acme").startswith("t_")
    assert hasher.operation("acme", "op-1").startswith("op_")


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        IdentityHasher(b"too-short")


def test_from_env_requires_the_secret_and_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(IDENTITY_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=IDENTITY_KEY_ENV):
        IdentityHasher.from_env()
    monkeypatch.setenv(IDENTITY_KEY_ENV, SECRET.decode())
    assert IdentityHasher.from_env().idempotency_key("a", "b") == IdentityHasher(
        SECRET
    ).idempotency_key("a", "b")


def test_ephemeral_hashers_do_not_agree() -> None:
    assert IdentityHasher.ephemeral().tenant("acme") != IdentityHasher.ephemeral().tenant("acme")
