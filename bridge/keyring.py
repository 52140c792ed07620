"""The identity keys a database was written under: the check before hashing, and rotation.

A process with another ``FENCEBRIDGE_IDENTITY_KEY`` than the deployment's derives other
idempotency keys: its lookups find nothing, so it reports an applied charge "not applied" and
sends it again. So the database records each key by its fingerprint (never the key) under a
key id, and every process and command that hashes or derives keys calls :func:`attach` first:

* no key recorded yet: the process records its key as key 1 (the key of every row written
  before keys were recorded), by a conditional insert; of two first uses at once, one wins
  and the other compares with it;
* its key must be the newest recorded key (the current one), each key in
  ``FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS`` must be a recorded one, every key that open rows
  (queued, claimed, unknown, quarantined) were written under must be held, and every erasure
  must have left its tombstones under a key it holds (an erasure hashes them under every key
  its process holds);
* otherwise it refuses, saying which key the database expects, and changes nothing.

A process keeps the keys it started with while the database moves on: a rotation records a
newer key, and an erasure run with that key alone hashes its tombstones under keys a bridge
started before the rotation does not hold. Such an erasure marks the keys it left out
(``missed_erasure_at``, migration 0024) and the inbox of a process whose every key is marked
refuses to write new work (:class:`~bridge.errors.IdentityKeysOutdated`) until it is restarted
with the current key; an erasure that holds the old key too leaves such a bridge working. An
erasure by a process without the current key is refused, under a lock every new key's record
waits for, so a process started with the new key alone never misses a tombstone.

Then the hasher and the store learn the key ids: new rows carry the current key's id, a claim
carries its row's id, and the row's idempotency key is derived under that key. The store
claims only rows whose key the process holds, so a bridge started before a rotation leaves
the new key's rows to the bridges restarted with it.

:func:`rotate` records a new key as current; rows already written keep theirs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bridge.errors import IdentityKeyMismatch, IdentityKeyUnrecorded
from bridge.identity import (
    IDENTITY_KEY_ENV,
    IDENTITY_PREVIOUS_KEYS_ENV,
    REUSE_ADVICE,
    IdentityHasher,
    shown,
)
from bridge.store.keys import KeyStore, KeyTransaction, RecordedKey

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyUse:
    """One recorded key, the rows written under it, and whether this environment holds it."""

    key: RecordedKey
    current: bool
    open_rows: int
    rows: int
    #: ``current`` or ``previous`` when the environment holds it, None when it does not (or
    #: no key is set)
    held: str | None


@dataclass(frozen=True, slots=True)
class Rotation:
    new: RecordedKey | None
    #: the key that was current before, and the earlier keys open rows still use
    previous: tuple[RecordedKey, ...]
    open_rows: dict[int, int]
    dry_run: bool


def attach(
    store: KeyStore, hasher: IdentityHasher, *, used_by: str, first_use: bool = True
) -> None:
    """Refuse keys the database was not written under, and bind the database's key ids to
    ``hasher`` and ``store``. Changes nothing when it refuses.

    With no key recorded yet, ``first_use`` records this one as key 1 (said at WARNING, with
    what it means): for the demo and a program that embeds the bridge. ``fencebridge run`` and
    the commands pass ``first_use=False`` and refuse instead (:class:`IdentityKeyUnrecorded`):
    a deployment's key is recorded on purpose, by ``fencebridge identity init``, never by the
    first process that happened to start with some key.
    """
    # one transaction: a refusal rolls back the first use's record too
    with store.transaction("identity keys") as tx:
        first = first_use and tx.register_first(hasher.fingerprint, used_by, None)
        keys = tx.recorded()
        if not keys:
            raise IdentityKeyUnrecorded(
                "no identity key is recorded in this database yet: record the deployment's key "
                f"on purpose with `fencebridge identity init --reason TEXT` ({IDENTITY_KEY_ENV} "
                f"set to it; this one's fingerprint is {shown(hasher.fingerprint)}), then start "
                "again; nothing was done"
            )
        _check(tx, keys, hasher)
    if first:
        log.warning(
            "identity key recorded on first use by %s: key 1 (fingerprint %s): every "
            "idempotency key and hashed identifier derives from it; give every bridge and "
            "command the same key",
            used_by,
            shown(hasher.fingerprint),
        )
    _bind(store, hasher, keys)


def verify(store: KeyStore, hasher: IdentityHasher) -> None:
    """:func:`attach` for commands that only show hashes: compares, records nothing (with no
    key recorded yet there is nothing to compare with)."""
    with store.transaction("identity keys") as tx:
        keys = tx.recorded()
        if not keys:
            return
        _check(tx, keys, hasher)
    _bind(store, hasher, keys)


def status(store: KeyStore, hasher: IdentityHasher | None) -> list[KeyUse]:
    """Every recorded key with its rows, and which of them this environment holds."""
    with store.transaction("identity status") as tx:
        keys = tx.recorded()
        counts = tx.rows()
    held: dict[str, str] = {}
    if hasher is not None:
        held = dict.fromkeys(hasher.previous_fingerprints, "previous")
        held[hasher.fingerprint] = "current"
    newest = keys[-1].key_id if keys else None
    return [
        KeyUse(
            key=k,
            current=k.key_id == newest,
            open_rows=counts.get(k.key_id, (0, 0))[0],
            rows=counts.get(k.key_id, (0, 0))[1],
            held=held.get(k.fingerprint),
        )
        for k in keys
    ]


def rotate(
    store: KeyStore,
    hasher: IdentityHasher,
    *,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> Rotation:
    """Record the environment's ``FENCEBRIDGE_IDENTITY_KEY`` as the new current key.

    The database's current key must be in ``FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS``, with every
    other key open rows were written under. A database that recorded no key yet records the
    one previous key as key 1 first. With ``dry_run`` everything is checked and rolled back.
    """
    if not actor or not reason:
        raise ValueError("a rotation needs an actor and a reason for the record")
    with store.transaction("identity rotate", dry_run=dry_run) as tx:
        keys = tx.recorded()
        if not keys:
            keys = _record_first_previous(tx, hasher, actor)
        by_fingerprint = {k.fingerprint: k for k in keys}
        current = keys[-1]
        mine = by_fingerprint.get(hasher.fingerprint)
        if mine is not None:
            raise IdentityKeyMismatch(
                f"{IDENTITY_KEY_ENV} is already recorded as {mine.describe()}"
                + (
                    ", the current key: nothing to rotate"
                    if mine is current
                    else "; a key that was rotated out is never brought back: rotate to a new one"
                )
            )
        if current.fingerprint not in hasher.previous_fingerprints:
            raise IdentityKeyMismatch(
                f"the database's current key, {current.describe()}, is not in "
                f"{IDENTITY_PREVIOUS_KEYS_ENV}: rotate with {IDENTITY_KEY_ENV} set to the new key "
                f"and {IDENTITY_PREVIOUS_KEYS_ENV} to the current key (and any earlier key open "
                "rows still use); nothing was changed"
            )
        _check_previous(by_fingerprint, hasher)
        held = [by_fingerprint[f].key_id for f in hasher.previous_fingerprints]
        missing = tx.open_rows(held)
        if missing:
            raise IdentityKeyMismatch(_missing_message(missing, keys) + "; nothing was changed")
        erased = tx.tombstone_keys([*held, current.key_id])
        if erased:
            raise IdentityKeyMismatch(_tombstone_message(erased, keys) + "; nothing was changed")
        if not tx.rotate(current.key_id, hasher.fingerprint, actor=actor, reason=reason):
            raise IdentityKeyMismatch(
                "another rotation recorded a new key meanwhile; nothing was changed: see "
                "`fencebridge identity status`"
            )
        after = tx.recorded()
        in_use = tx.open_rows([])
    new = next(k for k in after if k.fingerprint == hasher.fingerprint)
    previous = tuple(k for k in after if k.key_id in in_use or k.key_id == current.key_id)
    if not dry_run:
        log.info("identity key rotated: %s is current", new.describe())
    return Rotation(new=new, previous=previous, open_rows=in_use, dry_run=dry_run)


# -- the checks --------------------------------------------------------------------------------


def _check(tx: KeyTransaction, keys: list[RecordedKey], hasher: IdentityHasher) -> None:
    by_fingerprint = {k.fingerprint: k for k in keys}
    current = keys[-1]
    mine = by_fingerprint.get(hasher.fingerprint)
    if mine is None:
        raise IdentityKeyMismatch(
            f"{IDENTITY_KEY_ENV} (fingerprint {shown(hasher.fingerprint)}) is not a key this "
            f"database was written under: it expects {current.describe()}; nothing was done; "
            + REUSE_ADVICE
        )
    if mine is not current:
        raise IdentityKeyMismatch(
            f"{IDENTITY_KEY_ENV} is {mine.describe()}, which `fencebridge identity rotate` "
            f"replaced with {current.describe()} at "
            f"{current.registered_at.isoformat(timespec='minutes')}; "
            f"nothing was done. Set {IDENTITY_KEY_ENV} to {current.describe()}, the "
            f"deployment's current key, and keep {mine.describe()} in "
            f"{IDENTITY_PREVIOUS_KEYS_ENV} while rows written under it are open"
        )
    _check_previous(by_fingerprint, hasher)
    held = [by_fingerprint[f].key_id for f in (hasher.fingerprint, *hasher.previous_fingerprints)]
    missing = tx.open_rows(held)
    if missing:
        raise IdentityKeyMismatch(_missing_message(missing, keys) + "; nothing was done")
    erased = tx.tombstone_keys(held)
    if erased:
        raise IdentityKeyMismatch(_tombstone_message(erased, keys) + "; nothing was done")


def _check_previous(by_fingerprint: dict[str, RecordedKey], hasher: IdentityHasher) -> None:
    unknown = [f for f in hasher.previous_fingerprints if f not in by_fingerprint]
    if unknown:
        raise IdentityKeyMismatch(
            f"{IDENTITY_PREVIOUS_KEYS_ENV} holds {len(unknown)} key(s) this database never "
            f"recorded (fingerprint {', '.join(shown(f) for f in unknown)}): list only the "
            "deployment's earlier keys (`fencebridge identity status` shows the recorded "
            "fingerprints); nothing was done"
        )


def _tombstone_message(missing: dict[tuple[int, ...], int], keys: list[RecordedKey]) -> str:
    by_id = {k.key_id: k for k in keys}
    parts = [
        f"{n} erased operation(s) whose tombstones are under "
        + " or ".join(
            by_id[i].describe() if i in by_id else f"key {i} (never recorded)" for i in ids
        )
        for ids, n in sorted(missing.items())
    ]
    return (
        f"{'; '.join(parts)}, which this process does not hold: a redelivery of them would "
        f"not be recognised, so add one of them to {IDENTITY_PREVIOUS_KEYS_ENV} until "
        "`fencebridge purge` has removed them ([retention] tombstone_days)"
    )


def _missing_message(missing: dict[int, int], keys: list[RecordedKey]) -> str:
    by_id = {k.key_id: k for k in keys}
    parts = [
        f"{n} open operation(s) under "
        + (by_id[i].describe() if i in by_id else f"key {i} (never recorded)")
        for i, n in sorted(missing.items())
    ]
    return (
        f"{'; '.join(parts)}, which this process does not hold: their idempotency keys derive "
        f"from it, so add it to {IDENTITY_PREVIOUS_KEYS_ENV}"
    )


def _record_first_previous(
    tx: KeyTransaction, hasher: IdentityHasher, actor: str
) -> list[RecordedKey]:
    """A database that recorded no key yet: its rows were written under the one previous key."""
    previous = hasher.previous_fingerprints
    if len(previous) != 1:
        raise IdentityKeyMismatch(
            "the database has recorded no identity key yet, so the key its rows were written "
            f"under must be the one key in {IDENTITY_PREVIOUS_KEYS_ENV} (it holds "
            f"{len(previous)}); nothing was changed"
        )
    reason = "recorded by the first rotation: the key rows were written under until then"
    tx.register_first(previous[0], actor, reason)
    return tx.recorded()


def _bind(store: KeyStore, hasher: IdentityHasher, keys: list[RecordedKey]) -> None:
    hasher.bind({k.fingerprint: k.key_id for k in keys})
    key_id, held = hasher.key_id, hasher.held_key_ids
    assert key_id is not None
    assert held is not None
    store.bind(key_id, held, hasher.erased_operation_candidates)
