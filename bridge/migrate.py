"""Schema migrations: versioned SQL files shipped with the package, applied in one transaction.

``fencebridge migrate`` is an operator's command; the running bridge only checks the version
(:func:`require_current`) and never migrates a database by itself. Two migrators started at once
are serialised by a transaction-scoped advisory lock, so the second finds nothing left to do.
A migration that was edited after it was applied is refused (its checksum is recorded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from bridge import sql
from bridge.database import Connection, translate_errors
from bridge.errors import MigrationError


@dataclass(frozen=True, slots=True)
class Applied:
    version: int
    name: str


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def migrate(conn: Connection) -> list[Applied]:
    """Bring the schema up to date; returns the migrations this call applied (often none)."""
    known = sql.migrations()
    with translate_errors("migrate"), conn.transaction():
        conn.execute(sql.statement("migration_prepare"))
        conn.execute(sql.statement("migration_table"))
        rows = conn.execute(sql.statement("migration_applied")).fetchall()
        applied = {int(v): (str(n), str(c)) for v, n, c in rows}
        by_version = {m.version: m for m in known}
        for version, (name, checksum) in sorted(applied.items()):
            mine = by_version.get(version)
            if mine is None:
                raise MigrationError(
                    f"the database has migration {version} ({name}), which this version of "
                    "fencebridge does not know: upgrade fencebridge before running it here"
                )
            if _checksum(mine.sql) != checksum:
                raise MigrationError(
                    f"migration {version} ({name}) was changed after it was applied; "
                    "ship schema changes as a new migration"
                )
        done = []
        for migration in known:
            if migration.version in applied:
                continue
            conn.execute(migration.sql)
            conn.execute(
                sql.statement("migration_record"),
                {
                    "version": migration.version,
                    "name": migration.name,
                    "checksum": _checksum(migration.sql),
                },
            )
            done.append(Applied(migration.version, migration.name))
    return done


def current_version(conn: Connection) -> int:
    """The newest applied migration (0 for an empty database)."""
    with translate_errors("read schema version"):
        exists = conn.execute(sql.statement("migration_exists")).fetchone()
        if not exists or not exists[0]:
            return 0
        rows = conn.execute(sql.statement("migration_applied")).fetchall()
    return max((int(r[0]) for r in rows), default=0)


def require_current(conn: Connection) -> None:
    """Refuse to run against a schema older or newer than this code."""
    have = current_version(conn)
    want = sql.migrations()[-1].version
    if have < want:
        raise MigrationError(
            f"the database schema is at version {have}, this fencebridge needs {want}: "
            "run `fencebridge migrate` first"
        )
    if have > want:
        raise MigrationError(
            f"the database schema is at version {have}, newer than this fencebridge ({want})"
        )
