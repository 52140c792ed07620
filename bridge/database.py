"""Connections to PostgreSQL, and the one place where driver errors become fencebridge errors.

Connections are autocommit: a single fenced statement is its own transaction, costs one round
trip and cannot be left open by accident. Multi-statement work (an inbox batch, a class A
business write) opens an explicit transaction.

Every pooled connection is bounded in time (:class:`SessionTimeouts`): a statement, a wait for
a lock and a transaction left idle each have a limit, set when the session starts, so a
blocked or forgotten call ends in a clear error instead of holding a connection, and the rows
it locked, forever. Past a limit the server rolls the statement back: nothing was applied, and
:class:`~bridge.errors.StoreUnavailable` says which limit it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import psycopg
import psycopg.errors
from psycopg import conninfo
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from bridge.errors import ConfigError, MissingGrants, StoreError, StoreUnavailable

DATABASE_URL_ENV = "FENCEBRIDGE_DATABASE_URL"
APPLICATION_NAME = "fencebridge"
POOL_TIMEOUT_SECONDS_DEFAULT = 10.0

STATEMENT_TIMEOUT_DEFAULT = timedelta(seconds=30)
LOCK_TIMEOUT_DEFAULT = timedelta(seconds=10)
IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT = timedelta(seconds=60)

Connection = psycopg.Connection[TupleRow]


@dataclass(frozen=True, slots=True)
class SessionTimeouts:
    """Server-side limits of every statement, lock wait and idle transaction of a session.

    ``None`` (or zero) leaves the server's own setting in place. A class A transaction narrows
    the statement and idle limits to its deadline (see :mod:`bridge.deadline`).
    """

    statement: timedelta | None = STATEMENT_TIMEOUT_DEFAULT
    lock: timedelta | None = LOCK_TIMEOUT_DEFAULT
    idle_in_transaction: timedelta | None = IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT

    def options(self) -> str:
        """The libpq ``options`` that set them when the session starts (no extra round trip)."""
        settings = {
            "statement_timeout": self.statement,
            "lock_timeout": self.lock,
            "idle_in_transaction_session_timeout": self.idle_in_transaction,
        }
        return " ".join(
            f"-c {name}={milliseconds(value)}"
            for name, value in settings.items()
            if value is not None and value > timedelta(0)
        )


#: no limits of fencebridge's own: one-off connections (migrations, tests) bound themselves
UNBOUNDED = SessionTimeouts(statement=None, lock=None, idle_in_transaction=None)


def milliseconds(value: timedelta) -> int:
    """A duration as PostgreSQL's timeout settings take it (whole milliseconds, at least 1)."""
    return max(round(value.total_seconds() * 1000), 1)


#: the session settings of a pool whose statements are planned once per connection, never
#: compiled, and never planned as a scan of a whole table where an index serves: JIT compiles a
#: plan at every execution (PostgreSQL keeps no compiled code between them), and a tenant-fair
#: claim's plan, costed for shares the planner cannot size, looks dear enough to be compiled for
#: seconds before a run of half a millisecond; a plan is kept for the connection's life, and one
#: made while a table was empty (a new deployment's first minutes, once anything analyzed it)
#: joined a batch's keys to work_item by reading all of it, at every execution as it grew (a
#: round of ingest, claim and settlement of 10 deliveries: 6 ms, then 67 ms at 20,000 rows)
GENERIC_PLANS: Final = "-c plan_cache_mode=force_generic_plan -c jit=off -c enable_seqscan=off"


def _conninfo(url: str, timeouts: SessionTimeouts, *, generic_plans: bool = False) -> str:
    """The URL with fencebridge's application name and the session's limits added to any
    ``options`` it already carries (the URL's own settings come first, ours win)."""
    extra: dict[str, str] = {"application_name": APPLICATION_NAME}
    ours = " ".join(o for o in (timeouts.options(), GENERIC_PLANS if generic_plans else "") if o)
    if ours:
        theirs = conninfo.conninfo_to_dict(url).get("options")
        extra["options"] = f"{theirs} {ours}" if theirs else ours
    return conninfo.make_conninfo(url, **extra)


def database_url(explicit: str | None = None) -> str:
    """The database URL: the explicit one, else ``FENCEBRIDGE_DATABASE_URL``."""
    url = explicit or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ConfigError(
            f"no database configured: set {DATABASE_URL_ENV} (a libpq URL such as "
            "postgresql://user@host:5432/dbname) or pass --database-url"
        )
    try:
        conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # The parser's message quotes the URL, password included: it must not reach a log.
        raise ConfigError(
            f"{DATABASE_URL_ENV} is not a valid libpq URL (postgresql://user@host:5432/dbname)"
        ) from None
    return url


def open_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = POOL_TIMEOUT_SECONDS_DEFAULT,
    timeouts: SessionTimeouts | None = None,
    generic_plans: bool = False,
) -> ConnectionPool[Connection]:
    """A pool of autocommit connections, each bounded by ``timeouts`` (the defaults of
    :class:`SessionTimeouts` unless given); it does not wait for the database at construction.

    With ``generic_plans`` every statement a connection prepares keeps one plan
    (``plan_cache_mode = force_generic_plan``), never JIT-compiled (``jit = off``) nor made of a
    sequential scan where an index serves (``enable_seqscan = off``: a kept plan must not be
    costed for the size a table had when it was made; see :data:`GENERIC_PLANS`): the bridge's
    own statements are written for one plan each (the claims' limits are in their text), and a
    parameter the planner cannot size (a tenant-fair claim's share of each tenant) must not make
    it plan, or compile, a claim again at every execution. Not for a pool that runs ad hoc
    queries with optional filters (the console's).
    """
    pool: ConnectionPool[Connection] = ConnectionPool(
        _conninfo(
            url,
            timeouts if timeouts is not None else SessionTimeouts(),
            generic_plans=generic_plans,
        ),
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        timeout=timeout,
        name=APPLICATION_NAME,
        open=False,
    )
    pool.open(wait=False)
    return pool


def connect(url: str, *, timeouts: SessionTimeouts = UNBOUNDED) -> Connection:
    """One autocommit connection outside any pool (migrations, CLI commands, tests).

    Unbounded unless ``timeouts`` are given: a migration sets its own limits per step.
    """
    with translate_errors("connect"):
        conn: Connection = psycopg.connect(_conninfo(url, timeouts), autocommit=True)
    return conn


@contextmanager
def translate_errors(action: str) -> Iterator[None]:
    """Turn driver and pool errors into fencebridge's tree (see :mod:`bridge.errors`)."""
    try:
        yield
    except PoolTimeout as exc:
        raise StoreUnavailable(
            f"{action}: database unavailable ({exc}: the server is unreachable or every pooled "
            "connection is busy)"
        ) from exc
    except psycopg.errors.UndefinedTable as exc:
        raise StoreError(
            f"{action}: the fencebridge schema is missing; run `fencebridge migrate` ({exc})"
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MissingGrants(
            f"{action}: {_first_line(exc)}: the role lacks a grant; apply "
            "infra/postgres/roles.sql again after every migrate, and run each command as the "
            "role the documentation names for it"
        ) from exc
    except psycopg.errors.QueryCanceled as exc:
        # A statement the server cancelled was rolled back: nothing was applied.
        raise StoreUnavailable(f"{action}: {_cancelled(exc)}") from exc
    except psycopg.errors.LockNotAvailable as exc:
        raise StoreUnavailable(
            f"{action}: a lock was not granted within lock_timeout; the statement was rolled "
            "back and nothing was applied"
        ) from exc
    except psycopg.errors.IdleInTransactionSessionTimeout as exc:
        raise StoreUnavailable(
            f"{action}: the server ended the session after it sat idle in a transaction past "
            "idle_in_transaction_session_timeout; that transaction was rolled back"
        ) from exc
    except psycopg.errors.TransactionRollback as exc:
        # Deadlock or serialization failure: the transaction was rolled back, nothing happened.
        raise StoreUnavailable(f"{action}: transaction rolled back ({exc.sqlstate})") from exc
    except psycopg.OperationalError as exc:
        # The connection broke or the server went away. If it broke after the statement was
        # sent, the client cannot know whether it was applied. An error the server reported on
        # a live connection (a cancelled statement, a lock timeout) means nothing was applied.
        broke = exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))
        sent = (
            broke
            and not isinstance(exc, psycopg.errors.ConnectionTimeout)
            and "connect" not in action
        )
        raise StoreUnavailable(
            f"{action}: database unavailable ({_first_line(exc)})", outcome_unknown=sent
        ) from exc
    except psycopg.InterfaceError as exc:
        raise StoreUnavailable(
            f"{action}: connection unusable ({_first_line(exc)})", outcome_unknown=True
        ) from exc
    except psycopg.DatabaseError as exc:
        raise StoreError(f"{action}: {_first_line(exc)}") from exc


def _cancelled(exc: psycopg.errors.QueryCanceled) -> str:
    """What cancelled the statement, in words an operator can act on."""
    reason = (exc.diag.message_primary or "").lower()
    if "statement timeout" in reason:
        return (
            "the statement ran past statement_timeout and was cancelled; it was rolled back "
            "and nothing was applied"
        )
    if "lock timeout" in reason:
        return "a lock was not granted within lock_timeout; nothing was applied"
    return "the statement was cancelled and rolled back; nothing was applied"


def _first_line(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("22"):
        # A data exception quotes the offending value, which may be an identifier or payload:
        # its class and SQLSTATE say what went wrong without repeating it.
        return f"{type(exc).__name__} (SQLSTATE {sqlstate})"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
