"""The identity key's first day: record it on purpose (``identity init``), and replace a key
recorded by mistake while nothing was written under it (``identity reset``).

A bridge or command never records a key by itself (:func:`bridge.keyring.attach` with
``first_use=False``): a throwaway key in a first ``fencebridge run`` used to become the
deployment's key for good, with no way back but dropping the database, since ``identity
rotate`` needs the (lost) current key. Every key derives the idempotency keys providers
deduplicate by, so a key may be replaced only while no work row, intent, rejected delivery,
tombstone, shadow record or outbox message was written under it and no other fencebridge
session is connected; past that, only a rotation brings in another key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from bridge import sql
from bridge.database import Connection, translate_errors
from bridge.errors import IdentityKeyMismatch
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher, shown
from bridge.store.keys import KeyTransaction, RecordedKey

log = logging.getLogger(__name__)

#: how long a reset waits for sessions that just closed to leave the server's list
SESSIONS_PATIENCE_SECONDS: Final = 2.0

#: what a recorded key means, said wherever one is recorded
MEANING: Final = (
    "every idempotency key providers deduplicate by, and every hashed identifier in logs, "
    "spans and tombstones, derives from this key; keep it in the secret store and give every "
    "bridge and command the same one (another key is refused). While nothing is written under "
    "it, `fencebridge identity reset` can replace it; after that, only `fencebridge identity "
    "rotate`, which needs it"
)


@dataclass(frozen=True, slots=True)
class Recorded:
    key: RecordedKey
    #: False when the environment's key was already the recorded one (nothing written)
    new: bool


@dataclass(frozen=True, slots=True)
class Reset:
    replaced: RecordedKey
    key: RecordedKey
    dry_run: bool


def init(conn: Connection, hasher: IdentityHasher, *, actor: str, reason: str) -> Recorded:
    """Record the environment's key as key 1; the same key again changes nothing, another key
    is refused (with the way out: reset while unused, else rotate)."""
    with translate_errors("identity init"), conn.transaction():
        first = conn.execute(
            sql.statement("identity_init"),
            {"fingerprint": hasher.fingerprint, "actor": actor, "reason": reason},
        ).fetchone()
        keys = KeyTransaction(conn).recorded()
    mine = next((k for k in keys if k.fingerprint == hasher.fingerprint), None)
    if mine is None:
        raise IdentityKeyMismatch(
            f"this database already recorded {keys[-1].describe()}, not {IDENTITY_KEY_ENV} "
            f"(fingerprint {shown(hasher.fingerprint)}); nothing was changed. If that key was "
            "recorded by mistake and nothing was written under it, `fencebridge identity "
            "reset` replaces it; otherwise set the deployment's key"
        )
    if first is not None:
        log.warning("identity key recorded: %s; %s", mine.describe(), MEANING)
    return Recorded(key=mine, new=first is not None)


def reset(
    conn: Connection, hasher: IdentityHasher, *, actor: str, reason: str, dry_run: bool = False
) -> Reset:
    """Replace the one recorded key with the environment's, audited (``identity_key_reset``),
    only while nothing was written under it and no other fencebridge session is connected."""
    if not actor or not reason:
        raise ValueError("a reset needs an actor and a reason for the record")
    with translate_errors("identity reset"), conn.transaction(force_rollback=dry_run):
        conn.execute(sql.statement("identity_reset_lock"))
        keys = KeyTransaction(conn).recorded()
        _refuse_unless_unused(conn, keys, hasher)
        replaced = keys[0]
        done = conn.execute(
            sql.statement("identity_reset"),
            {
                "key_id": replaced.key_id,
                "replaced": replaced.fingerprint,
                "fingerprint": hasher.fingerprint,
                "actor": actor,
                "reason": reason,
            },
        ).fetchone()
        if done is None:
            raise IdentityKeyMismatch("the recorded key changed meanwhile; nothing was changed")
        key = KeyTransaction(conn).recorded()[0]
    if not dry_run:
        log.warning(
            "identity key reset: %s replaced %s (unused); %s",
            key.describe(),
            replaced.describe(),
            MEANING,
        )
    return Reset(replaced=replaced, key=key, dry_run=dry_run)


def _refuse_unless_unused(
    conn: Connection, keys: list[RecordedKey], hasher: IdentityHasher
) -> None:
    if not keys:
        raise IdentityKeyMismatch(
            "no identity key is recorded: nothing to reset; `fencebridge identity init` records "
            "the deployment's key"
        )
    if len(keys) > 1:
        raise IdentityKeyMismatch(
            f"{len(keys)} keys are recorded (a rotation happened): keys are in use, and only "
            "`fencebridge identity rotate` brings in another; nothing was changed"
        )
    if keys[0].fingerprint == hasher.fingerprint:
        raise IdentityKeyMismatch(
            f"{IDENTITY_KEY_ENV} is already the recorded {keys[0].describe()}: nothing to reset"
        )
    written = [str(what) for what, n in conn.execute(sql.statement("identity_reset_written")) if n]
    if written:
        raise IdentityKeyMismatch(
            f"{keys[0].describe()} is in use: {', '.join(written)} were written under it, and "
            "another key would derive other idempotency keys for them; nothing was changed. "
            "Set the deployment's key, or bring in a new one with `fencebridge identity rotate`"
        )
    others = _other_sessions(conn)
    if others:
        raise IdentityKeyMismatch(
            f"{others} other fencebridge session(s) are connected to this database (a bridge, a "
            "console, a command): stop them first, so that none keeps hashing under the replaced "
            "key; nothing was changed"
        )


def _other_sessions(conn: Connection) -> int:
    """Other fencebridge sessions, asked again for a moment while some are seen: a command's
    own connection that just closed (its first contact, :mod:`bridge.store.reach`) leaves the
    server's list when its backend has exited, a moment later."""

    def count() -> int:
        found = conn.execute(sql.statement("identity_reset_sessions")).fetchone()
        return int(found[0]) if found is not None else 0

    retrying = Retrying(
        stop=stop_after_delay(SESSIONS_PATIENCE_SECONDS),
        wait=wait_fixed(0.1),
        retry=retry_if_result(bool),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else 0,
    )
    seen: int = retrying(count)
    return seen
