"""The identity keys' table family: the keys a database was written under (``identity_key``),
the rows and tombstones under each, and a rotation's record.

:mod:`bridge.keyring` decides (the checks before hashing, what a rotation may do); this module
runs its statements, each check and its write in one transaction
(:meth:`KeyStore.transaction`), and binds the key ids a process holds to its
:class:`~bridge.store.db.Database`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from bridge import sql
from bridge.database import Connection
from bridge.identity import shown
from bridge.store.db import Database, ErasedHashes


@dataclass(frozen=True, slots=True)
class RecordedKey:
    key_id: int
    fingerprint: str
    registered_at: datetime
    registered_by: str
    reason: str | None
    #: when an erasure first left its tombstones under other keys only (migration 0024): a
    #: process holding no other key that was never missed refuses to write new work since
    missed_erasure_at: datetime | None = None

    def describe(self) -> str:
        return f"key {self.key_id} (fingerprint {shown(self.fingerprint)})"


class KeyTransaction:
    """The identity statements inside one transaction: a refusal raised in the ``with`` block
    rolls back what was recorded in it."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def register_first(self, fingerprint: str, registered_by: str, reason: str | None) -> bool:
        """Record ``fingerprint`` as key 1 while no key is recorded; whether this call did."""
        row = self._conn.execute(
            sql.statement("identity_register_first"),
            {"fingerprint": fingerprint, "registered_by": registered_by, "reason": reason},
        ).fetchone()
        return row is not None

    def recorded(self) -> list[RecordedKey]:
        """Every recorded key, oldest first (the last is the current one)."""
        rows = self._conn.execute(sql.statement("identity_keys")).fetchall()
        return [RecordedKey(int(i), f, at, by, why, missed) for i, f, at, by, why, missed in rows]

    def rows(self) -> dict[int, tuple[int, int]]:
        """(open rows, rows) written under each key id."""
        rows = self._conn.execute(sql.statement("identity_rows")).fetchall()
        return {int(k): (int(o), int(t)) for k, o, t in rows}

    def open_rows(self, held: Sequence[int]) -> dict[int, int]:
        """Open rows written under a key not in ``held``, by key id."""
        rows = self._conn.execute(
            sql.statement("identity_open_rows"), {"held": list(held)}
        ).fetchall()
        return {int(k): int(n) for k, n in rows}

    def tombstone_keys(self, held: Sequence[int]) -> dict[tuple[int, ...], int]:
        """The erased operations none of whose tombstones is under a key in ``held``, by the
        keys their tombstones are under (an erasure hashes each one under every key it holds)."""
        rows = self._conn.execute(
            sql.statement("identity_tombstone_keys"), {"held": list(held)}
        ).fetchall()
        return {tuple(int(k) for k in ks): int(n) for ks, n in rows}

    def rotate(self, current_id: int, fingerprint: str, *, actor: str, reason: str) -> bool:
        """Record ``fingerprint`` as the key after ``current_id``; False when another rotation
        recorded one meanwhile."""
        row = self._conn.execute(
            sql.statement("identity_rotate"),
            {
                "current_id": current_id,
                "fingerprint": fingerprint,
                "actor": actor,
                "reason": reason,
            },
        ).fetchone()
        return row is not None


class KeyStore:
    """The identity keys of one database, and the key ids this process binds to it."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @contextmanager
    def transaction(self, action: str, *, dry_run: bool = False) -> Iterator[KeyTransaction]:
        """One transaction for ``action``'s statements (rolled back with ``dry_run``)."""
        with self._db.connection(action) as conn, conn.transaction(force_rollback=dry_run):
            yield KeyTransaction(conn)

    def bind(self, current: int, held: Sequence[int], erased: ErasedHashes | None) -> None:
        """Write new rows under ``current``, claim rows under ``held``, and look tombstones up
        by ``erased`` (:meth:`bridge.store.db.Database.use_identity_keys`)."""
        self._db.use_identity_keys(current, held, erased)
