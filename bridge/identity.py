"""Keyed hashes of operation identifiers: idempotency keys for providers, labels for telemetry.

Raw tenant and operation identifiers never leave fencebridge: a provider sees an opaque
idempotency key, logs and spans see short keyed hashes. All are HMAC-SHA256 under one secret
(``FENCEBRIDGE_IDENTITY_KEY``) with a distinct purpose label each, so one cannot be turned into
another, and the identifier parts are length-prefixed so ``("ab", "c")`` and ``("a", "bc")``
never collide.

The secret must not change while operations may be retried: a new secret derives new
idempotency keys, and a provider would then see a repeated operation as a new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

from bridge.errors import ConfigError

IDENTITY_KEY_ENV = "FENCEBRIDGE_IDENTITY_KEY"
IDEMPOTENCY_KEY_PREFIX = "fb1_"
_MIN_SECRET_BYTES = 16


def _encode(*parts: str) -> bytes:
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


class IdentityHasher:
    """Derives every opaque form of an identifier from one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < _MIN_SECRET_BYTES:
            raise ConfigError(f"{IDENTITY_KEY_ENV} must be at least {_MIN_SECRET_BYTES} bytes")
        self._secret = secret

    @classmethod
    def from_env(cls) -> IdentityHasher:
        value = os.environ.get(IDENTITY_KEY_ENV)
        if not value:
            raise ConfigError(
                f"{IDENTITY_KEY_ENV} is not set: it keys idempotency keys and the hashed "
                "identifiers in logs and spans (e.g. `openssl rand -hex 32`)"
            )
        return cls(value.encode("utf-8"))

    @classmethod
    def ephemeral(cls) -> IdentityHasher:
        """A random secret, for the demo and tests only (keys change on every start)."""
        return cls(secrets.token_bytes(32))

    def _mac(self, purpose: str, *parts: str) -> bytes:
        return hmac.new(self._secret, _encode(purpose, *parts), hashlib.sha256).digest()

    def idempotency_key(self, tenant_id: str, operation_id: str) -> str:
        """Stable, tenant-scoped, opaque: 52 characters of ``[a-z2-7_]``, within common limits."""
        digest = self._mac("idempotency-key", tenant_id, operation_id)[:30]
        return IDEMPOTENCY_KEY_PREFIX + base64.b32encode(digest).decode("ascii").lower()

    def tenant(self, tenant_id: str) -> str:
        """Short hash of a tenant id for logs, labels and spans."""
        return "t_" + self._mac("tenant", tenant_id)[:8].hex()

    def operation(self, tenant_id: str, operation_id: str) -> str:
        """Short hash of an operation (tenant-scoped) for logs and spans."""
        return "op_" + self._mac("operation", tenant_id, operation_id)[:10].hex()
