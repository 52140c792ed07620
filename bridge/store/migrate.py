"""Schema migrations: versioned SQL files shipped with the package, safe to run on a live table.

``fencebridge migrate`` is an operator's command; the running bridge only checks the version
(:func:`require_current`) and never migrates a database by itself. Two migrators started at once
are serialised by a session advisory lock (tried, with backoff, never waited on inside the
server), so the second finds nothing left to do. A migration
that was edited after it was applied is refused (its checksum is recorded).

Migrations run beside a bridge that keeps claiming and settling, so none may stop the work
table for long:

* each migration runs in a transaction of its own, under a short ``lock_timeout``. DDL waiting
  for a lock queues every later query on the table behind it; a migration that does not get
  its locks in time gives way (its transaction rolls back, nothing is applied) and is tried
  again with jittered backoff (tenacity), up to ``attempts`` times;
* a migration whose first line is ``-- fencebridge: no transaction`` runs outside any
  transaction, statement by statement (``CREATE INDEX CONCURRENTLY``, which lets writes go on
  while the index is built). Its statements must be safe to repeat (``IF NOT EXISTS``); an
  invalid index left by an interrupted build is dropped and built again. It is recorded once
  every statement succeeded.

Released migrations are never edited in a way that changes what they do to a database that
applied them. When a released migration had to change how it works (0002 built an index inside
its transaction; that index moved to 0003, built concurrently), the checksum of the released
text stays accepted (:data:`RELEASED_CHECKSUMS`): such a database already has the effect, is not
migrated again, and the later migration finds its work done.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import LiteralString

import psycopg
import psycopg.errors
from psycopg import sql as pgsql
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from bridge import sql
from bridge.database import Connection, milliseconds, translate_errors
from bridge.errors import MigrationError

log = logging.getLogger(__name__)

#: how long a migration's statement waits for a lock before it gives way and is retried
LOCK_TIMEOUT_DEFAULT = timedelta(seconds=2)
#: tries per migration (or per statement of one that runs outside a transaction)
ATTEMPTS_DEFAULT = 30
#: how long a migrator waits for another one that is running to finish
OTHER_MIGRATOR_PATIENCE = timedelta(hours=1)
#: the longest pause between two tries (full jitter below it)
BACKOFF_MAX_SECONDS = 10.0

#: checksums of released texts of a migration, other than the shipped one, whose database is
#: valid as it is: version -> {sha256: why}. A migration recorded as applied is not run again.
RELEASED_CHECKSUMS: dict[int, dict[str, str]] = {
    2: {
        "150f3d4bc2b52be5e6a4f844be039d4fefb6c9d4dc0fe1978bf1977f4eb6e163": (
            "0002 as first released, which built work_item_terminal inside its transaction; "
            "0003 now builds it concurrently and finds it in place"
        ),
    },
}

_CONCURRENT = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)\s", re.IGNORECASE
)
_DROP_CONCURRENT = re.compile(r"DROP\s+INDEX\s+CONCURRENTLY\s+IF\s+EXISTS\s+\w+$", re.IGNORECASE)
#: a lock not granted in time, or a deadlock the server broke: nothing was applied, try again
_GAVE_WAY = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected)


@dataclass(frozen=True, slots=True)
class Applied:
    version: int
    name: str


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def migrate(
    conn: Connection,
    *,
    lock_timeout: timedelta = LOCK_TIMEOUT_DEFAULT,
    attempts: int = ATTEMPTS_DEFAULT,
    wait: Callable[[RetryCallState], float] | None = None,
    other_migrator: timedelta = OTHER_MIGRATOR_PATIENCE,
) -> list[Applied]:
    """Bring the schema up to date; returns the migrations this call applied (often none).

    ``conn`` must be in autocommit mode (some migrations run outside a transaction).
    ``wait`` replaces the backoff between tries (a tenacity wait), for tests. Another
    migrator already running is waited for up to ``other_migrator``.
    """
    if not conn.autocommit:
        raise MigrationError("migrate needs an autocommit connection")
    if attempts < 1:
        raise MigrationError("migrate needs at least one attempt per migration")
    runner = _Runner(conn, lock_timeout, attempts, wait or _backoff)
    with translate_errors("migrate"):
        _take_migration_lock(conn, other_migrator)
        try:
            return runner.run()
        finally:
            conn.execute(sql.statement("migration_unlock"))


class _Held(Exception):  # noqa: N818  (a condition that is retried, never raised out)
    """Another migrator holds the migration lock."""


def _take_migration_lock(conn: Connection, patience: timedelta) -> None:
    """Take the migrators' lock, trying again while another migrator holds it."""

    def attempt() -> None:
        got = conn.execute(sql.statement("migration_prepare")).fetchone()
        if not got or not got[0]:
            raise _Held

    retrying = Retrying(
        retry=retry_if_exception_type(_Held),
        wait=wait_random_exponential(multiplier=0.05, max=1.0),
        stop=stop_after_delay(patience.total_seconds()),
        reraise=True,
    )
    try:
        retrying(attempt)
    except _Held:
        raise MigrationError(
            f"another `fencebridge migrate` has held the migration lock for over "
            f"{patience.total_seconds():g}s; nothing was applied by this one"
        ) from None


_backoff = wait_random_exponential(multiplier=0.25, max=BACKOFF_MAX_SECONDS)


class _Runner:
    def __init__(
        self,
        conn: Connection,
        lock_timeout: timedelta,
        attempts: int,
        wait: Callable[[RetryCallState], float],
    ) -> None:
        self._conn = conn
        self._lock_timeout = str(milliseconds(lock_timeout))
        self._attempts = attempts
        self._wait = wait

    def run(self) -> list[Applied]:
        conn = self._conn
        known = sql.migrations()
        conn.execute(sql.statement("migration_table"))
        rows = conn.execute(sql.statement("migration_applied")).fetchall()
        applied = {int(v): (str(n), str(c)) for v, n, c in rows}
        _check_applied(applied, {m.version: m for m in known})
        done = []
        for migration in known:
            if migration.version in applied:
                continue
            if migration.transactional:
                self._retried(migration, "", partial(self._in_transaction, migration))
            else:
                for statement in _concurrent_statements(migration):
                    self._retried(migration, statement, partial(self._alone, statement))
                self._record(migration)
            done.append(Applied(migration.version, migration.name))
        return done

    def _retried(self, migration: sql.Migration, statement: str, step: Callable[[], None]) -> None:
        """Run ``step`` until its locks are granted in time, or give up with a clear error."""

        def gave_way(state: RetryCallState) -> None:
            log.info(
                "migration %d (%s) waited lock_timeout for a lock and gave way (try %d of %d)",
                migration.version,
                migration.name,
                state.attempt_number,
                self._attempts,
            )

        retrying = Retrying(
            retry=retry_if_exception_type(_GAVE_WAY),
            wait=self._wait,
            stop=stop_after_attempt(self._attempts),
            before_sleep=gave_way,
            reraise=True,
        )
        try:
            retrying(step)
        except _GAVE_WAY as exc:
            what = f"migration {migration.version} ({migration.name})"
            raise MigrationError(
                f"{what} did not get its locks within lock_timeout in {self._attempts} tries "
                f"({type(exc).__name__}): a long transaction or another DDL holds them; nothing "
                "of it was applied, run `fencebridge migrate` again once they are released"
                + (f" (statement: {statement.splitlines()[0]})" if statement else "")
            ) from exc

    def _in_transaction(self, migration: sql.Migration) -> None:
        conn = self._conn
        with conn.transaction():
            conn.execute(
                sql.statement("migration_lock_timeout"),
                {"lock_timeout": self._lock_timeout, "is_local": True},
            )
            conn.execute(migration.sql)
            self._record(migration)

    def _alone(self, statement: LiteralString) -> None:
        conn = self._conn
        index = _CONCURRENT.match(statement)
        conn.execute(
            sql.statement("migration_lock_timeout"),
            {"lock_timeout": self._lock_timeout, "is_local": False},
        )
        try:
            if index is not None:
                # A build that gave way (or was interrupted) left an invalid index: drop it,
                # or IF NOT EXISTS would take it for built.
                self._drop_invalid(index.group(1))
            conn.execute(statement)
        finally:
            conn.execute(
                sql.statement("migration_lock_timeout"), {"lock_timeout": "0", "is_local": False}
            )

    def _drop_invalid(self, name: str) -> None:
        conn = self._conn
        if conn.execute(sql.statement("migration_invalid_index"), {"name": name}).fetchone():
            log.info("dropping the invalid index an interrupted build left (%s)", name)
            drop = pgsql.SQL(sql.statement("migration_drop_index")).format(
                index=pgsql.Identifier(name)
            )
            conn.execute(drop)

    def _record(self, migration: sql.Migration) -> None:
        self._conn.execute(
            sql.statement("migration_record"),
            {
                "version": migration.version,
                "name": migration.name,
                "checksum": _checksum(migration.sql),
            },
        )


def _check_applied(
    applied: dict[int, tuple[str, str]], by_version: dict[int, sql.Migration]
) -> None:
    for version, (name, checksum) in sorted(applied.items()):
        mine = by_version.get(version)
        if mine is None:
            raise MigrationError(
                f"the database has migration {version} ({name}), which this version of "
                "fencebridge does not know: upgrade fencebridge before running it here"
            )
        if checksum != _checksum(mine.sql) and checksum not in RELEASED_CHECKSUMS.get(version, {}):
            raise MigrationError(
                f"migration {version} ({name}) was changed after it was applied; "
                "ship schema changes as a new migration"
            )


def _concurrent_statements(migration: sql.Migration) -> list[LiteralString]:
    """The statements of a migration run outside a transaction; each must be safe to repeat."""
    statements = migration.statements()
    for statement in statements:
        if not (_CONCURRENT.match(statement) or _DROP_CONCURRENT.match(statement)):
            raise MigrationError(
                f"migration {migration.version} ({migration.name}) runs outside a transaction, "
                "so each of its statements must be safe to repeat: CREATE [UNIQUE] INDEX "
                "CONCURRENTLY IF NOT EXISTS or DROP INDEX CONCURRENTLY IF EXISTS, found: "
                + statement.splitlines()[0]
            )
    return statements


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
