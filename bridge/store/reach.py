"""A command's first contact with the database: reach it, check its schema and the role's
grants, and say what is wrong in one line before anything else runs.

Every command that uses the database calls :func:`reach` first, so a server that is down, a
database that is misnamed, a schema that was never migrated and a role without the grants the
command needs end the same way for ``run``, ``console``, ``check`` and every verb: one line
naming the cause and the URL (without its password), and an exit code of its own
(:mod:`bridge.cli`). Without it, ``run`` waited on its pool for ten seconds and ended in the
pool's traceback, the cause only in warnings above it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg import conninfo

from bridge import sql
from bridge.database import APPLICATION_NAME
from bridge.errors import DatabaseUnreachable, MissingGrants, SchemaNotCurrent, StoreUnavailable
from bridge.store.migrate import current_version

#: how long the first connection may take unless the URL sets ``connect_timeout`` itself
CONNECT_TIMEOUT_SECONDS: Final = 5

#: table -> privileges: what a role needs, per kind of command (infra/postgres/roles.sql grants
#: the same sets to <prefix>_bridge, <prefix>_operator and <prefix>_console)
Grants = Mapping[str, tuple[str, ...]]

_ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")
_ADD = ("SELECT", "INSERT")

#: nothing beyond reading the schema version (``migrate`` creates what it needs)
NO_GRANTS: Final[Grants] = {}

#: the running bridge, and the verbs that write with its credentials (redrive, purge, erase...)
BRIDGE_GRANTS: Final[Grants] = {
    "work_item": _ALL,
    "payload": _ALL,
    "rejected_delivery": _ALL,
    "redrive_audit": _ADD,
    "fencebridge_migration": ("SELECT",),
    "identity_key": _ADD,
    "work_attempt": _ALL,
    "rate_wait": _ALL,
    "erased_operation": ("SELECT", "DELETE"),
    "shadow_operation": ("SELECT", "INSERT", "DELETE"),
    "shadow_delivery": ("SELECT", "INSERT", "DELETE"),
    "outbox_message": _ALL,
    "outbox_relay": ("SELECT", "INSERT", "UPDATE"),
    "outbox_audit": _ADD,
    "token_bucket": _ALL,
}

#: the verbs that only read (status, inspect, check, ``identity show``)
READ_GRANTS: Final[Grants] = dict.fromkeys(
    (
        "work_item",
        "rejected_delivery",
        "redrive_audit",
        "fencebridge_migration",
        "identity_key",
        "work_attempt",
        "rate_wait",
        "erased_operation",
        "outbox_message",
    ),
    ("SELECT",),
)

#: ``fencebridge console``: what an operator reads, and the writes of a redrive
CONSOLE_GRANTS: Final[Grants] = {
    **READ_GRANTS,
    "work_item": ("SELECT", "INSERT", "UPDATE"),
    "payload": _ADD,
    "rejected_delivery": ("SELECT", "INSERT", "UPDATE"),
    "redrive_audit": _ADD,
    "identity_key": _ADD,
    "work_attempt": _ADD,
}


def reach(
    url: str, grants: Grants = READ_GRANTS, *, schema: bool = True, create: bool = False
) -> None:
    """Connect once, check the schema version (unless not ``schema``: ``migrate`` makes it),
    ``grants`` and, with ``create``, the right to create tables (``migrate``'s); raise the one
    fault found.

    :class:`~bridge.errors.DatabaseUnreachable` (the server, the database or the login),
    :class:`~bridge.errors.SchemaNotCurrent`, :class:`~bridge.errors.MissingGrants`.
    """
    shown = shown_url(url)
    try:
        conn = psycopg.connect(_first_contact(url), autocommit=True)
    except psycopg.OperationalError as exc:
        raise DatabaseUnreachable(f"{_connect_cause(exc)} ({shown})") from None
    with conn:
        try:
            if schema:
                _check_schema(conn, shown)
            missing = _missing(conn, grants)
            if create:
                missing += _cannot_create(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise MissingGrants(
                f"{_role(conn)}: {_first_line(exc)} ({shown}); {_GRANT_HINT}"
            ) from None
        except MissingGrants as exc:  # the schema version's table, read through the store
            raise MissingGrants(f"{_role(conn)}: {exc} ({shown})") from None
        except (StoreUnavailable, psycopg.OperationalError) as exc:
            raise DatabaseUnreachable(
                f"database unavailable: {_first_line(exc)} ({shown})"
            ) from None
        if missing:
            listed = ", ".join(f"{p} on {t}" for t, p in missing)
            raise MissingGrants(f"{_role(conn)} lacks {listed} ({shown}); {_GRANT_HINT}")


_GRANT_HINT: Final = (
    "apply infra/postgres/roles.sql again after every migrate, and run this command as the role "
    "the documentation names for it"
)


def _check_schema(conn: psycopg.Connection[tuple[object, ...]], shown: str) -> None:
    have = current_version(conn)
    want = sql.migrations()[-1].version
    if have == 0:
        raise SchemaNotCurrent(
            f"no fencebridge schema in this database ({shown}): run `fencebridge migrate`"
        )
    if have < want:
        raise SchemaNotCurrent(
            f"the schema is at version {have}, this fencebridge needs {want} ({shown}): run "
            "`fencebridge migrate`"
        )
    if have > want:
        raise SchemaNotCurrent(
            f"the schema is at version {have}, newer than this fencebridge ({want}) ({shown}): "
            "upgrade fencebridge"
        )


def _missing(conn: psycopg.Connection[tuple[object, ...]], grants: Grants) -> list[tuple[str, str]]:
    pairs = [(t, p) for t, privileges in grants.items() for p in privileges]
    if not pairs:
        return []
    rows = conn.execute(
        sql.statement("reach_missing_grants"),
        {"tables": [t for t, _ in pairs], "privileges": [p for _, p in pairs]},
    ).fetchall()
    return [(str(t), str(p)) for t, p in rows]


def _cannot_create(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
    found = conn.execute(sql.statement("reach_cannot_create")).fetchone()
    return [] if found is None else [(f"schema {found[0]}", "CREATE")]


def _role(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    found = conn.execute(sql.statement("reach_current_role")).fetchone()
    return f"role {found[0] if found else conn.info.user!r}"


def _first_contact(url: str) -> str:
    extra: dict[str, str | int] = {"application_name": APPLICATION_NAME}
    if "connect_timeout" not in conninfo.conninfo_to_dict(url):
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    return conninfo.make_conninfo(url, **extra)


_FATAL = re.compile(r"^(?:FATAL|ERROR):\s+")


def _connect_cause(exc: psycopg.OperationalError) -> str:
    """What libpq's connection error says, reduced to its cause: ``no such database``, ``login
    refused`` or ``database unreachable``, then the server's or the network's own words."""
    text = _first_line(exc)
    said = _FATAL.sub("", text.rsplit(" failed: ", 1)[-1]).strip()
    if re.search(r'database ".*" does not exist', said):
        return f"no such database: {said}"
    if re.search(
        r"password authentication failed|role \".*\" does not exist|pg_hba\.conf|"
        r"authentication|permission denied for database",
        said,
    ):
        return f"login refused: {said}"
    return f"database unreachable: {said}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def shown_url(url: str) -> str:
    """The URL as a message may show it: everything but the password (in the user part of a
    ``postgresql://`` URL, in its query, or as a ``password=`` keyword)."""
    if "://" not in url:
        params = conninfo.conninfo_to_dict(url)
        params.pop("password", None)
        return conninfo.make_conninfo("", **{k: v for k, v in params.items() if v is not None})
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, hosts = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}@{hosts}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
