"""Keyed hashes of operation identifiers: idempotency keys for providers, labels for telemetry.

Raw tenant and operation identifiers never leave fencebridge: a provider sees an opaque
idempotency key, logs and spans see short keyed hashes. All are HMAC-SHA256 under a secret
(``FENCEBRIDGE_IDENTITY_KEY``) with a distinct purpose label each, so one cannot be turned into
another, and the identifier parts are length-prefixed so ``("ab", "c")`` and ``("a", "bc")``
never collide.

A provider deduplicates by idempotency key, so an operation must keep the key it was first
attempted under: a new secret would derive a new key, and the provider would take a retry for
a new operation. The database therefore records each secret's fingerprint under a key id and
stamps every work row with the id of the key it was written under (:mod:`bridge.keyring`).
A rotation adds a key for new operations; the earlier ones stay in
``FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS`` while rows written under them may still run, and each
row's idempotency key is derived under its own key. Log and span hashes always use the
current key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from bridge.errors import ConfigError, IdentityKeyMissing

IDENTITY_KEY_ENV = "FENCEBRIDGE_IDENTITY_KEY"
IDENTITY_PREVIOUS_KEYS_ENV = "FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS"
IDEMPOTENCY_KEY_PREFIX = "fb1_"
#: the key id of rows written before the database recorded any key: the first key recorded
FIRST_KEY_ID = 1
#: hex digits of a fingerprint shown to people; the database keeps all 64
FINGERPRINT_SHOWN = 12
_MIN_SECRET_BYTES = 16
_FINGERPRINT_LABEL = b"fencebridge identity key fingerprint v1"

#: what to do when the key is missing or wrong: reuse the deployment's key, never make one
REUSE_ADVICE = (
    f"set {IDENTITY_KEY_ENV} to the deployment's key, the value every bridge and command on "
    "this database uses (`fencebridge identity status` shows the fingerprint the database "
    "expects); a new key would make providers take retried operations for new ones, so only "
    "a first-time setup or `fencebridge identity rotate` brings one in"
)


def fingerprint(secret: bytes) -> str:
    """A keyed hash of a constant: names a secret in the database without revealing it."""
    return hmac.new(secret, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def shown(fingerprint_hex: str) -> str:
    """The prefix of a fingerprint that people compare."""
    return fingerprint_hex[:FINGERPRINT_SHOWN]


def _encode(*parts: str) -> bytes:
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def _checked(secret: bytes, name: str) -> bytes:
    if len(secret) < _MIN_SECRET_BYTES:
        raise ConfigError(f"{name} must be at least {_MIN_SECRET_BYTES} bytes")
    return secret


class IdentityHasher:
    """Derives every opaque form of an identifier from the current secret, and a row's
    idempotency key from the secret that row was written under."""

    def __init__(self, secret: bytes, previous: Sequence[bytes] = ()) -> None:
        self._secret = _checked(secret, IDENTITY_KEY_ENV)
        self._previous = tuple(_checked(p, IDENTITY_PREVIOUS_KEYS_ENV) for p in previous)
        self._by_fingerprint: dict[str, bytes] = {}
        for s in (self._secret, *self._previous):
            if fingerprint(s) in self._by_fingerprint:
                raise ConfigError(
                    f"{IDENTITY_PREVIOUS_KEYS_ENV} repeats a key (or holds {IDENTITY_KEY_ENV} "
                    "itself): list each earlier key once"
                )
            self._by_fingerprint[fingerprint(s)] = s
        #: key id -> secret, once :mod:`bridge.keyring` has read the database's key ids
        self._by_id: dict[int, bytes] | None = None
        self._key_id: int | None = None

    @classmethod
    def from_env(cls) -> IdentityHasher:
        value = os.environ.get(IDENTITY_KEY_ENV)
        if not value:
            raise ConfigError(
                f"{IDENTITY_KEY_ENV} is not set: it keys idempotency keys and the hashed "
                f"identifiers in logs and spans; {REUSE_ADVICE}"
            )
        previous = [p.strip() for p in os.environ.get(IDENTITY_PREVIOUS_KEYS_ENV, "").split(",")]
        return cls(value.encode("utf-8"), [p.encode("utf-8") for p in previous if p])

    @classmethod
    def optional_from_env(cls) -> IdentityHasher | None:
        """The environment's keys, or None when no key is set (for commands that can do
        without hashes)."""
        return cls.from_env() if os.environ.get(IDENTITY_KEY_ENV) else None

    @classmethod
    def ephemeral(cls) -> IdentityHasher:
        """A random secret, for the demo and tests only (keys change on every start)."""
        return cls(secrets.token_bytes(32))

    # -- the keys and their ids --------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """The current key's fingerprint."""
        return fingerprint(self._secret)

    @property
    def previous_fingerprints(self) -> tuple[str, ...]:
        return tuple(fingerprint(p) for p in self._previous)

    @property
    def key_id(self) -> int | None:
        """The database's id of the current key; None until bound."""
        return self._key_id

    @property
    def held_key_ids(self) -> tuple[int, ...] | None:
        """The database's ids of every key held; None until bound."""
        return None if self._by_id is None else tuple(sorted(self._by_id))

    def bind(self, ids: Mapping[str, int]) -> None:
        """Learn the database's key id of each fingerprint (:func:`bridge.keyring.attach`
        checks first that the current key is the database's current key)."""
        held = {i: self._by_fingerprint[f] for f, i in ids.items() if f in self._by_fingerprint}
        current = ids.get(self.fingerprint)
        if current is None:
            raise ValueError("bind needs the current key's id")
        self._by_id, self._key_id = held, current

    def _secret_for(self, key_id: int) -> bytes:
        if self._by_id is None:
            # Not bound: this hasher has not consulted a database. Rows written before any
            # key was recorded are key 1, the one key in use; anything else needs the ids.
            if key_id == FIRST_KEY_ID:
                return self._secret
        elif key_id in self._by_id:
            return self._by_id[key_id]
        raise IdentityKeyMissing(
            f"the row was written under identity key {key_id}, which this process does not "
            f"hold: add that key to {IDENTITY_PREVIOUS_KEYS_ENV} (`fencebridge identity "
            "status` lists the keys rows still use)"
        )

    # -- derivations -------------------------------------------------------------------------

    @staticmethod
    def _mac(secret: bytes, purpose: str, *parts: str) -> bytes:
        return hmac.new(secret, _encode(purpose, *parts), hashlib.sha256).digest()

    def idempotency_key(self, tenant_id: str, operation_id: str, key_id: int | None = None) -> str:
        """Stable, tenant-scoped, opaque: 52 characters of ``[a-z2-7_]``, within common limits.

        ``key_id`` is the key the operation's row was written under (the current key if None).
        """
        return self.idempotency_key_deriver(tenant_id, operation_id, key_id)()

    def idempotency_key_deriver(
        self, tenant_id: str, operation_id: str, key_id: int | None = None
    ) -> Callable[[], str]:
        """:meth:`idempotency_key`, derived when called; the key is looked up now, so a row
        written under a key this process does not hold is refused here, before any run."""
        secret = self._secret if key_id is None else self._secret_for(key_id)
        return partial(_idempotency_key, secret, tenant_id, operation_id)

    def tenant(self, tenant_id: str) -> str:
        """Short hash of a tenant id for logs, labels and spans."""
        return "t_" + self._mac(self._secret, "tenant", tenant_id)[:8].hex()

    def payload(self, tenant_id: str, digest: bytes) -> str:
        """Keyed, tenant-scoped hash of a payload's digest: equal payloads of two tenants look
        different, and nobody without the key can confirm a guessed payload against it."""
        return "p_" + self._mac(self._secret, "payload", tenant_id, digest.hex())[:10].hex()

    def operation(self, tenant_id: str, operation_id: str) -> str:
        """Short hash of an operation (tenant-scoped) for logs and spans."""
        return "op_" + self._mac(self._secret, "operation", tenant_id, operation_id)[:10].hex()

    # -- tombstones ----------------------------------------------------------------------------

    def erased_operation(self, tenant_id: str, operation_id: str) -> bytes:
        """The full-length keyed hash of an erased operation's tombstone under the current key
        (an erasure stores one under every key held: :meth:`erased_operation_candidates`).
        Full length, unlike the log hashes: a collision would make a new operation a replay."""
        return self._mac(self._secret, "erased-operation", tenant_id, operation_id)

    def erased_operation_candidates(
        self, tenant_id: str, operation_id: str
    ) -> list[tuple[int, bytes]]:
        """The operation's tombstone hash under every key this process holds, by key id: what
        the inbox looks tombstones up by (a tombstone written before a rotation is found under
        the key it was written with), and what an erasure stores them under (so a bridge still
        running on an earlier key finds them too). Unbound (no database consulted): the current
        key only, as key 1."""
        if self._by_id is None:
            return [(FIRST_KEY_ID, self.erased_operation(tenant_id, operation_id))]
        return [
            (key_id, self._mac(secret, "erased-operation", tenant_id, operation_id))
            for key_id, secret in sorted(self._by_id.items())
        ]


def _idempotency_key(secret: bytes, tenant_id: str, operation_id: str) -> str:
    digest = IdentityHasher._mac(secret, "idempotency-key", tenant_id, operation_id)[:30]
    return IDEMPOTENCY_KEY_PREFIX + base64.b32encode(digest).decode("ascii").lower()
