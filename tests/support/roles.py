"""infra/postgres/roles.sql applied under a prefix of the test's own, and removed again.

Roles are cluster-wide and other tests share the server, so every role made here carries a
random prefix (the script's ``fencebridge.role_prefix`` setting). A role is assumed with
``-c role=...`` at connect, which is ``SET ROLE`` for the whole session: every privilege and
policy check then runs as that role.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

ROLES_SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "roles.sql"

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class Roles:
    """The role names of one application of roles.sql, and how to connect as each."""

    prefix: str
    db_url: str

    @property
    def migrator(self) -> str:
        return f"{self.prefix}_migrator"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}_bridge"

    @property
    def operator(self) -> str:
        return f"{self.prefix}_operator"

    @property
    def console(self) -> str:
        return f"{self.prefix}_console"

    @property
    def tenant_group(self) -> str:
        return f"{self.prefix}_tenant"

    def url_as(self, role: str) -> str:
        return conninfo.make_conninfo(self.db_url, options=f"-c role={role}")

    def connect_as(self, role: str) -> Conn:
        conn: Conn = psycopg.connect(self.url_as(role), autocommit=True)
        return conn


def apply_roles(url: str, prefix: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET fencebridge.role_prefix = {}").format(sql.Literal(prefix)))
        conn.execute(ROLES_SQL.read_text())


def drop_roles(url: str, prefix: str) -> None:
    """Drop every role with this run's prefix, after clearing what they own or were granted."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s",
                (prefix.replace("_", r"\_") + r"\_%",),
            ).fetchall()
        ]
        for name in names:
            role = sql.Identifier(name)
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(role))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
        for name in names:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
