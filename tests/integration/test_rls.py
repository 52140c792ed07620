"""Row-level security: a tenant's database role sees and changes only that tenant's rows.

Roles are cluster-wide, so each test creates its own with a random suffix and drops them again.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bridge.store import PostgresStore
from bridge.types import Decision, Delivery, Key, Rejection, TargetClass

Db = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True)
class Roles:
    t1: str
    t2: str
    unmapped: str


@pytest.fixture
def roles(db: Db) -> Iterator[Roles]:
    suffix = secrets.token_hex(4)
    made = Roles(t1=f"fbt_t1_{suffix}", t2=f"fbt_t2_{suffix}", unmapped=f"fbt_none_{suffix}")
    names = [made.t1, made.t2, made.unmapped]
    created: list[str] = []
    try:
        for name in names:
            db.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
            created.append(name)
            db.execute(
                sql.SQL(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON work_item, payload, rejected_delivery"
                    " TO {}"
                ).format(sql.Identifier(name))
            )
            db.execute(sql.SQL("GRANT SELECT ON tenant_role TO {}").format(sql.Identifier(name)))
            db.execute(
                sql.SQL("GRANT USAGE ON SEQUENCE work_item_seq TO {}").format(sql.Identifier(name))
            )
        db.execute(
            "INSERT INTO tenant_role (role_name, tenant_id) VALUES (%s, 't1'), (%s, 't2')",
            (made.t1, made.t2),
        )
        yield made
    finally:
        for name in created:
            db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def as_role(db_url: str) -> Iterator[Db]:
    """A second connection, on which a test switches to a tenant role with ``SET ROLE``."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def become(conn: Db, role: str) -> None:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))


def delivery(tenant: str, op: str, payload: bytes | None = None) -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="refunds",
        job_type="refund",
        target_class=TargetClass.A,
        payload=payload if payload is not None else f"{tenant}/{op}".encode(),
    )


@pytest.fixture
def rows(store: PostgresStore) -> None:
    """Both tenants with the same operation ids; a rejection for t1, a conflict for t2."""
    store.inbox.ingest(
        [
            delivery("t1", "op-1"),
            delivery("t1", "op-2"),
            delivery("t2", "op-1"),
            delivery("t2", "op-3"),
            Rejection(subscription="refunds", reason="bad", body=b"?", tenant_id="t1"),
        ]
    )
    (result,) = store.inbox.ingest([delivery("t2", "op-1", b"changed")])
    assert result.decision is Decision.CONFLICT


def visible(conn: Db, table: str) -> list[Any]:
    query = sql.SQL("SELECT tenant_id FROM {} ORDER BY 1").format(sql.Identifier(table))
    return [r[0] for r in conn.execute(query).fetchall()]


def test_a_tenant_role_sees_only_its_own_rows(
    roles: Roles, rows: None, db: Db, as_role: Db
) -> None:
    assert visible(db, "work_item") == ["t1", "t1", "t2", "t2"]  # the owner sees everything
    become(as_role, roles.t1)
    assert visible(as_role, "work_item") == ["t1", "t1"]
    assert visible(as_role, "payload") == ["t1", "t1", "t1"]  # two work rows, one rejection
    assert visible(as_role, "rejected_delivery") == ["t1"]
    become(as_role, roles.t2)
    keys = as_role.execute("SELECT tenant_id, operation_id FROM work_item ORDER BY 2").fetchall()
    assert keys == [("t2", "op-1"), ("t2", "op-3")]
    assert visible(as_role, "payload") == ["t2", "t2"]
    assert visible(as_role, "rejected_delivery") == ["t2"]  # its conflict, not t1's rejection
    mapping = as_role.execute("SELECT role_name, tenant_id FROM tenant_role").fetchall()
    assert mapping == [(roles.t2, "t2")]  # nor the other roles' mapping


def test_a_tenant_role_cannot_change_another_tenants_rows(
    roles: Roles, rows: None, db: Db, as_role: Db
) -> None:
    before = db.execute("SELECT * FROM work_item ORDER BY 1, 2").fetchall()
    become(as_role, roles.t1)
    updated = as_role.execute(
        "UPDATE work_item SET state = 'unknown' WHERE tenant_id = 't2' AND operation_id = 'op-1'"
    )
    assert updated.rowcount == 0
    assert as_role.execute("DELETE FROM work_item WHERE tenant_id = 't2'").rowcount == 0
    assert as_role.execute("DELETE FROM payload WHERE tenant_id = 't2'").rowcount == 0
    assert as_role.execute("DELETE FROM rejected_delivery WHERE tenant_id = 't2'").rowcount == 0
    # The same operation id of its own tenant is reachable: the filter is the policy, not luck.
    own = as_role.execute("UPDATE work_item SET outcome_code = 'seen' WHERE operation_id = 'op-1'")
    assert own.rowcount == 1
    after = db.execute("SELECT * FROM work_item ORDER BY 1, 2").fetchall()
    changed = [a for b, a in zip(before, after, strict=True) if a != b]
    assert [(r[0], r[1]) for r in changed] == [("t1", "op-1")]
    assert db.execute("SELECT count(*) FROM payload WHERE tenant_id = 't2'").fetchone() == (2,)


def test_a_tenant_role_cannot_move_a_row_to_another_tenant(
    roles: Roles, rows: None, as_role: Db
) -> None:
    become(as_role, roles.t1)
    for table in ("payload", "rejected_delivery"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            as_role.execute(sql.SQL("UPDATE {} SET tenant_id = 't2'").format(sql.Identifier(table)))
    # A work row's identity cannot change at all, whoever asks.
    with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
        as_role.execute("UPDATE work_item SET tenant_id = 't2'")


def test_a_tenant_role_cannot_insert_for_another_tenant(
    roles: Roles, rows: None, db: Db, as_role: Db
) -> None:
    become(as_role, roles.t1)
    insert = (
        "INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,"
        " payload_hash, payload_ref) VALUES (%s, 'op-9', 'refunds', 'refund', 'A',"
        " sha256('x'), 'pg:x')"
    )
    as_role.execute(insert, ("t1",))  # its own tenant: allowed
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        as_role.execute(insert, ("t2",))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        as_role.execute("INSERT INTO payload (payload_ref, tenant_id, body) VALUES ('p', 't2', '')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        as_role.execute(
            "INSERT INTO rejected_delivery (kind, reason, subscription, tenant_id)"
            " VALUES ('quarantined', 'x', 'refunds', 't2')"
        )
    owners = db.execute("SELECT tenant_id FROM work_item WHERE operation_id = 'op-9'").fetchall()
    assert owners == [("t1",)]


def test_an_unmapped_role_sees_nothing(roles: Roles, rows: None, as_role: Db) -> None:
    become(as_role, roles.unmapped)
    for table in ("work_item", "payload", "rejected_delivery", "tenant_role"):
        assert visible(as_role, table) == [], table
    assert as_role.execute("DELETE FROM work_item").rowcount == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        as_role.execute("INSERT INTO payload (payload_ref, tenant_id, body) VALUES ('p', 't1', '')")


def test_a_tenant_role_cannot_remap_itself(roles: Roles, as_role: Db) -> None:
    become(as_role, roles.t1)
    # The mapping's policy would let a role update its own row: the grant is what stops it.
    with pytest.raises(
        psycopg.errors.InsufficientPrivilege, match="permission denied for table tenant_role"
    ):
        as_role.execute("UPDATE tenant_role SET tenant_id = 't2'")


def test_the_store_is_not_limited_by_tenant_policies(
    roles: Roles, rows: None, store: PostgresStore
) -> None:
    """The bridge owns the tables; policies scope tenant roles, not the bridge."""
    claims = store.claims.claim("w", 10, timedelta(seconds=30))
    assert {c.key for c in claims} == {
        Key("t1", "op-1"),
        Key("t1", "op-2"),
        Key("t2", "op-1"),
        Key("t2", "op-3"),
    }
