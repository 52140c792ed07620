"""The database every table family of the store works on: the pool, and what every
family's statements share.

:class:`Database` holds the connection pool (opened by :func:`bridge.database.open_pool`), the
clock (``now`` of every statement: the database's own unless a test gave one), the attempt
history and priority aging the settling statements take, the identity keys this process holds,
a connection kept per thread for a loop that calls many times a second, and the fenced write
(:meth:`Database.fenced_write`) every settlement goes through. The families of
:mod:`bridge.store` each take one; nothing outside the store holds the pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from psycopg_pool import ConnectionPool

from bridge import sql
from bridge.database import Connection, translate_errors
from bridge.errors import LeaseLost
from bridge.store.arrays import BigintArray, TextArray
from bridge.store.work import ATTEMPT_HISTORY_DEFAULT, PRIORITY_AGING_DEFAULT
from bridge.types import Claim, Key, TargetClass, Ticket

Clock = Callable[[], datetime | None]

#: how long a thread keeps one connection (:meth:`PostgresStore.keep_connection`) before it
#: hands it back and takes another: the pool renews connections only as they come back
KEEP_SECONDS = 60.0

#: an operation's tombstone hash under every identity key held, by key id (:mod:`bridge.identity`)
ErasedHashes = Callable[[str, str], list[tuple[int, bytes]]]


#: the SQLSTATE of an inbox write refused because an erasure hashed its tombstones under none of
#: the keys this process holds, and of an erasure by a process without the current key (0024)
KEYS_MISSED = "FBKEY"


def database_clock() -> datetime | None:
    return None


#: a server by the host and port a connection reached (of the URL's hosts, the one it uses)
Server = tuple[str, int]


def server_of(conn: Connection) -> Server:
    return conn.info.host, conn.info.port


class Database:
    """The bridge's connection pool and what every table family's statements share: the
    clock (``now``), the attempt history and priority aging the settling statements take, the
    identity keys this process holds, a connection kept per thread, and the fenced write.
    Thread-safe: every call borrows a pooled connection (or this thread's kept one).

    The families of :mod:`bridge.store` each take one; nothing outside the store holds the
    pool.
    """

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        clock: Clock = database_clock,
        attempt_history: int = ATTEMPT_HISTORY_DEFAULT,
        priority_aging: timedelta = PRIORITY_AGING_DEFAULT,
    ) -> None:
        if attempt_history < 0:
            raise ValueError("attempt_history is a count of attempts kept per row (0: none)")
        if priority_aging < timedelta(0):
            raise ValueError("priority_aging is how far one priority step moves a row: not < 0")
        self._pool = pool
        #: the ``now`` of every statement: None (the database clock) unless a test gave a clock
        self.now = clock
        #: attempts kept per row, written by the statements that end attempts (0 records none)
        self.attempt_history = attempt_history
        #: seconds of claim order one priority step is worth (migration 0012)
        self.aging = priority_aging.total_seconds()
        #: set by :meth:`use_identity_keys`: the id new rows carry, the ids claims accept
        self.identity_key: int | None = None
        self.identity_keys: list[int] | None = None
        #: set with the keys: how the inbox finds an inserted operation's tombstone
        self.erased_hashes: ErasedHashes | None = None
        #: the connection each thread that called :meth:`keep_connection` uses
        self._kept = threading.local()
        self._kept_lock = threading.Lock()
        self._kept_open: set[Connection] = set()

    @property
    def pool(self) -> ConnectionPool[Connection]:
        """The pool itself, for the tests and benchmarks that size and watch it; product code
        outside the store never takes it (the layout test keeps ``psycopg_pool`` in here)."""
        return self._pool

    def close(self) -> None:
        """Close the pool, and the connections threads still keep (the pool closes those only
        once they come back)."""
        with self._kept_lock:
            kept, self._kept_open = self._kept_open, set()
        for conn in kept:
            conn.close()
        self._pool.close()

    def wait(self, timeout: float = 30.0) -> None:
        """Block until the pool holds its minimum of connections (a benchmark's warm start)."""
        self._pool.wait(timeout=timeout)

    def use_identity_keys(
        self, current: int, held: Sequence[int], erased: ErasedHashes | None = None
    ) -> None:
        """Write new rows under identity key ``current``; claim only rows written under a key
        in ``held`` (a row under another key needs a process that holds it); ``erased`` derives
        the tombstone hashes the inbox looks erased operations up by. Until called, new rows
        take the database's current key, claims take any row, and an ingest that would write
        new work refuses while any tombstone exists (it cannot tell whether one matches)."""
        self.identity_key = current
        self.identity_keys = list(held)
        self.erased_hashes = erased

    def last_server(self) -> Server | None:
        """The server (host and port of the bridge's URL) this thread's last call was sent
        to: where what it committed is. With a URL naming a primary and its standbys, a call
        after a failover may reach another server than the one before it."""
        server: Server | None = getattr(self._kept, "server", None)
        return server

    def keep_connection(self) -> None:
        """From now on this thread's calls use one connection (until :meth:`release_connection`
        or a call that fails), not the pool's oldest idle one each time: a loop that calls many
        times a second keeps its server process, and that process's caches, warm (measured:
        docs/benchmarks.md, "Worker tier"). The connection goes back to the pool every
        :data:`KEEP_SECONDS`, so the pool's own age limit still renews it."""
        self._kept.on = True

    def release_connection(self) -> None:
        """Give the connection this thread kept back to the pool (nothing if it kept none)."""
        self._kept.on = False
        self._return_kept()

    def _return_kept(self) -> None:
        conn: Connection | None = getattr(self._kept, "conn", None)
        self._kept.conn = None
        if conn is not None:
            with self._kept_lock:
                self._kept_open.discard(conn)
            self._pool.putconn(conn)  # a broken one is discarded, an open transaction rolled back

    @contextmanager
    def connection(self, action: str) -> Iterator[Connection]:
        """A connection for one call (this thread's kept one, if it keeps one); a database
        error is raised as the store's error for ``action``."""
        if not getattr(self._kept, "on", False):
            with translate_errors(action), self._pool.connection() as conn:
                self._kept.server = server_of(conn)
                yield conn
            return
        kept: Connection | None = getattr(self._kept, "conn", None)
        if kept is not None and time.monotonic() >= self._kept.until:
            self._return_kept()
            kept = None
        try:
            with translate_errors(action):
                if kept is None:
                    kept = self._kept.conn = self._pool.getconn()
                    self._kept.until = time.monotonic() + KEEP_SECONDS
                    with self._kept_lock:
                        self._kept_open.add(kept)
                self._kept.server = server_of(kept)
                yield kept
        except BaseException:
            self._return_kept()  # the next call takes a connection known to be good
            raise

    def fenced_write(
        self, action: str, name: str, ticket: Ticket, /, **params: Any
    ) -> tuple[Any, ...]:
        """Run one statement guarded by ``fence = :fence AND state = 'claimed'``.

        The row it returns is the proof the fence was current; no row raises LeaseLost.
        """
        with self.connection(action) as conn:
            row = conn.execute(
                sql.statement(name),
                {
                    **ticket_params(ticket),
                    **params,
                    "now": self.now(),
                    "history": self.attempt_history,
                    "aging": self.aging,
                },
            ).fetchone()
        if row is None:
            raise lost(ticket, action)
        return row

    def guarded_write(self, name: str, params: dict[str, Any], *, dry_run: bool) -> bool:
        """Run one operator move whose guard is inside the statement; False when the row had
        moved on. A dry run executes it and rolls back."""
        with self.connection("redrive") as conn, conn.transaction(force_rollback=dry_run):
            row = conn.execute(
                sql.statement(name), {**params, "now": self.now(), "aging": self.aging}
            ).fetchone()
        return row is not None


def lost(ticket: Ticket, action: str) -> LeaseLost:
    return LeaseLost(ticket.tenant_id, ticket.operation_id, ticket.fence, action)


def ticket_params(ticket: Ticket) -> dict[str, Any]:
    return {
        "tenant_id": ticket.tenant_id,
        "operation_id": ticket.operation_id,
        "fence": ticket.fence,
    }


def tickets_params(tickets: Sequence[Ticket]) -> dict[str, Any]:
    return {
        "tenant_id": TextArray([t.tenant_id for t in tickets]),
        "operation_id": TextArray([t.operation_id for t in tickets]),
        "fence": BigintArray([t.fence for t in tickets]),
    }


def keys_params(keys: Sequence[Key]) -> dict[str, Any]:
    return {
        "tenant_id": TextArray([k.tenant_id for k in keys]),
        "operation_id": TextArray([k.operation_id for k in keys]),
    }


def claim_from_row(row: tuple[Any, ...]) -> Claim:
    (
        tenant_id,
        operation_id,
        fence,
        attempts,
        max_attempts,
        subscription,
        job_type,
        target_class,
        schema_version,
        payload_hash,
        lease_expires_at,
        intent_fence,
        takeover,
        trace_context,
        broker_message_id,
        receive_count,
        ordering_key,
        payload,
        identity_key_id,
    ) = row
    return Claim(
        tenant_id=tenant_id,
        operation_id=operation_id,
        fence=fence,
        attempts=attempts,
        max_attempts=max_attempts,
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        schema_version=schema_version,
        payload=bytes(payload) if payload is not None else None,
        payload_hash=bytes(payload_hash),
        lease_expires_at=lease_expires_at,
        intent_fence=intent_fence,
        takeover=takeover,
        trace_context=trace_context,
        broker_message_id=broker_message_id,
        receive_count=receive_count,
        ordering_key=ordering_key,
        identity_key_id=int(identity_key_id),
    )
