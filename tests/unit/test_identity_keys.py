"""The environment's identity keys: the current one, the earlier ones, and the advice given
when the key is missing (reuse the deployment's key, never make a fresh one)."""

from __future__ import annotations

import pytest

from bridge.errors import ConfigError, IdentityKeyMissing
from bridge.identity import (
    IDENTITY_KEY_ENV,
    IDENTITY_PREVIOUS_KEYS_ENV,
    IdentityHasher,
    fingerprint,
)

CURRENT = "unit-current-identity-key-000001"
EARLIER = "unit-earlier-identity-key-000002"
OLDEST = "unit-oldest-identity-key-0000003"


def test_without_a_key_the_advice_is_to_reuse_the_deployments_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(IDENTITY_KEY_ENV, raising=False)
    with pytest.raises(ConfigError) as missing:
        IdentityHasher.from_env()
    message = str(missing.value)
    assert f"{IDENTITY_KEY_ENV} is not set" in message
    assert "the deployment's key" in message
    assert "fencebridge identity status" in message
    assert "openssl" not in message
    assert IdentityHasher.optional_from_env() is None


def test_previous_keys_are_read_comma_separated_and_each_must_be_distinct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(IDENTITY_KEY_ENV, CURRENT)
    monkeypatch.setenv(IDENTITY_PREVIOUS_KEYS_ENV, f" {EARLIER} , {OLDEST},")
    hasher = IdentityHasher.from_env()
    assert hasher.fingerprint == fingerprint(CURRENT.encode())
    assert hasher.previous_fingerprints == (
        fingerprint(EARLIER.encode()),
        fingerprint(OLDEST.encode()),
    )
    monkeypatch.setenv(IDENTITY_PREVIOUS_KEYS_ENV, f"{EARLIER},{CURRENT}")
    with pytest.raises(ConfigError, match="list each earlier key once"):
        IdentityHasher.from_env()
    monkeypatch.setenv(IDENTITY_PREVIOUS_KEYS_ENV, "short")
    with pytest.raises(ConfigError, match=f"{IDENTITY_PREVIOUS_KEYS_ENV} must be at least"):
        IdentityHasher.from_env()


def test_a_bound_hasher_derives_each_key_id_under_its_own_key_and_refuses_unknown_ids() -> None:
    hasher = IdentityHasher(CURRENT.encode(), [EARLIER.encode()])
    hasher.bind({fingerprint(EARLIER.encode()): 1, fingerprint(CURRENT.encode()): 2})
    assert hasher.key_id == 2
    assert hasher.held_key_ids == (1, 2)
    earlier, current = IdentityHasher(EARLIER.encode()), IdentityHasher(CURRENT.encode())
    assert hasher.idempotency_key("t", "op", 1) == earlier.idempotency_key("t", "op")
    assert hasher.idempotency_key("t", "op", 2) == current.idempotency_key("t", "op")
    assert hasher.idempotency_key("t", "op") == current.idempotency_key("t", "op")
    # Hashes for logs and spans always use the current key.
    assert hasher.tenant("t") == current.tenant("t")
    with pytest.raises(IdentityKeyMissing, match=IDENTITY_PREVIOUS_KEYS_ENV):
        hasher.idempotency_key("t", "op", 3)


def test_the_fingerprint_names_the_key_without_showing_it() -> None:
    hasher = IdentityHasher(CURRENT.encode())
    assert CURRENT not in hasher.fingerprint
    assert CURRENT.encode().hex() not in hasher.fingerprint
    assert hasher.fingerprint == IdentityHasher(CURRENT.encode()).fingerprint
    assert hasher.fingerprint != fingerprint(EARLIER.encode())
