"""Connections to PostgreSQL, and the one place where driver errors become fencebridge errors.

Connections are autocommit: a single fenced statement is its own transaction, costs one round
trip and cannot be left open by accident. Multi-statement work (an inbox batch, a class A
business write) opens an explicit transaction.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg.errors
from psycopg import conninfo
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from bridge.errors import ConfigError, StoreError, StoreUnavailable

DATABASE_URL_ENV = "FENCEBRIDGE_DATABASE_URL"
APPLICATION_NAME = "fencebridge"
POOL_TIMEOUT_SECONDS_DEFAULT = 10.0

Connection = psycopg.Connection[TupleRow]


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
) -> ConnectionPool[Connection]:
    """A pool of autocommit connections; it does not wait for the database at construction."""
    pool: ConnectionPool[Connection] = ConnectionPool(
        conninfo.make_conninfo(url, application_name=APPLICATION_NAME),
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        timeout=timeout,
        name=APPLICATION_NAME,
        open=False,
    )
    pool.open(wait=False)
    return pool


def connect(url: str) -> Connection:
    """One autocommit connection outside any pool (migrations, CLI commands, tests)."""
    with translate_errors("connect"):
        conn: Connection = psycopg.connect(
            conninfo.make_conninfo(url, application_name=APPLICATION_NAME), autocommit=True
        )
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


def _first_line(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("22"):
        # A data exception quotes the offending value, which may be an identifier or payload:
        # its class and SQLSTATE say what went wrong without repeating it.
        return f"{type(exc).__name__} (SQLSTATE {sqlstate})"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
