"""infra/postgres/roles.sql on a migrated database: each role can do its job, and no more.

Roles are cluster-wide and other tests share the server, so every role made here carries a
random prefix (the script's ``fencebridge.role_prefix`` setting) and is dropped afterwards. A
role is assumed with ``-c role=...`` at connect, which is ``SET ROLE`` for the whole session:
every privilege and policy check then runs as that role.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors, sql

from bridge import keyring
from bridge import sql as bridge_sql
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.migrate import current_version, migrate
from bridge.store.work import Settlement
from bridge.types import Decision, Delivery, Key, RedriveFilter, State, TargetClass
from tests.support.erasure import erase_operation
from tests.support.postgres import create_database, drop_database, unique_name
from tests.support.roles import Conn, Roles, apply_roles, drop_roles

LEASE = timedelta(seconds=30)
ADMIN_FUNCTIONS = {"fencebridge_add_tenant_role", "fencebridge_remove_tenant_role"}


@pytest.fixture
def roles(db_url: str) -> Iterator[Roles]:
    """roles.sql applied twice (it must be re-runnable) with a prefix private to this test."""
    prefix = f"fbroles_{secrets.token_hex(4)}"
    try:
        apply_roles(db_url, prefix)
        apply_roles(db_url, prefix)
        yield Roles(prefix, db_url)
    finally:
        drop_roles(db_url, prefix)


@pytest.fixture
def admin(roles: Roles, db: Conn) -> Conn:
    """The superuser connection, with the prefix set the way the documentation says."""
    db.execute(sql.SQL("SET fencebridge.role_prefix = {}").format(sql.Literal(roles.prefix)))
    return db


@pytest.fixture
def bridge_store(roles: Roles) -> Iterator[PostgresStore]:
    store = PostgresStore.connect(roles.url_as(roles.bridge), max_size=2)
    try:
        yield store
    finally:
        store.close()


def delivery(tenant: str, op: str, payload: bytes = b'{"amount": 5}') -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="refunds",
        job_type="refund",
        target_class=TargetClass.C,
        payload=payload,
    )


def seed(store: PostgresStore) -> None:
    """Two tenants whose operation ids collide, and one conflict for acme."""
    results = store.inbox.ingest(
        [
            delivery("acme", "op-1", b"acme-1"),
            delivery("acme", "op-2", b"acme-2"),
            delivery("globex", "op-1", b"globex-1"),
            delivery("acme", "op-1", b"acme-1-changed"),
        ]
    )
    assert [r.decision for r in results] == [
        Decision.NEW,
        Decision.NEW,
        Decision.NEW,
        Decision.CONFLICT,
    ]


def current_user(conn: Conn) -> str:
    row = conn.execute("SELECT current_user").fetchone()
    assert row is not None
    return str(row[0])


def privileges_snapshot(conn: Conn) -> list[tuple[object, ...]]:
    return conn.execute(
        """
        SELECT c.relname, c.relowner::regrole::text, c.relacl::text
          FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace
         ORDER BY c.relname
        """
    ).fetchall()


def test_the_script_is_idempotent(roles: Roles, db: Conn) -> None:
    before = privileges_snapshot(db)
    apply_roles(roles.db_url, roles.prefix)
    assert privileges_snapshot(db) == before


def test_role_attributes(roles: Roles, db: Conn) -> None:
    rows = db.execute(
        """
        SELECT rolname, rolcanlogin, rolbypassrls, rolsuper, rolcreaterole, rolcreatedb
          FROM pg_roles WHERE rolname = ANY (%s) ORDER BY rolname
        """,
        ([roles.migrator, roles.bridge, roles.operator, roles.console, roles.tenant_group],),
    ).fetchall()
    assert {r[0]: r[1:] for r in rows} == {
        roles.bridge: (True, True, False, False, False),
        roles.console: (True, True, False, False, False),
        roles.migrator: (True, False, False, False, False),
        roles.operator: (True, True, False, False, False),
        roles.tenant_group: (False, False, False, False, False),
    }
    settings = db.execute(
        "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE r.rolname = %s",
        (roles.operator,),
    ).fetchone()
    assert settings is not None
    assert "default_transaction_read_only=on" in settings[0]


def test_the_migrator_owns_every_object_the_migrations_create(roles: Roles, db: Conn) -> None:
    # A migration that adds a table or function without listing it in roles.sql fails here.
    owners = db.execute(
        """
        SELECT c.relname, c.relowner::regrole::text
          FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace
           AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
        """
    ).fetchall()
    assert owners
    assert {name: roles.migrator for name, _ in owners} == dict(owners)
    functions = db.execute(
        "SELECT p.proname, p.proowner::regrole::text FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace"
    ).fetchall()
    assert {name for name, _ in functions} >= ADMIN_FUNCTIONS
    assert {n: o for n, o in functions if n not in ADMIN_FUNCTIONS} == {
        n: roles.migrator for n, _ in functions if n not in ADMIN_FUNCTIONS
    }


#: the functions only the bridge may execute: the erasures and the claims' rooms (they take the
#: limited job types' claim locks)
BRIDGE_FUNCTIONS = {
    "fencebridge_erase_under_keys",
    "fencebridge_erase",
    "fencebridge_concurrency_room",
    "fencebridge_claim_room",
}


def test_only_the_bridge_executes_the_erasures_and_the_claims_rooms(roles: Roles, db: Conn) -> None:
    rows = db.execute(
        "SELECT p.proname, r.rolname, has_function_privilege(r.rolname, p.oid, 'EXECUTE')"
        "  FROM pg_proc p CROSS JOIN unnest(%s::text[]) AS r(rolname)"
        " WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(%s)",
        (
            [roles.bridge, roles.operator, roles.console, roles.tenant_group],
            sorted(BRIDGE_FUNCTIONS),
        ),
    ).fetchall()
    assert {name for name, _, _ in rows} == BRIDGE_FUNCTIONS
    assert {(name, role) for name, role, allowed in rows if allowed} == {
        (name, roles.bridge) for name in BRIDGE_FUNCTIONS
    }


def test_the_migrator_can_migrate_and_change_the_schema(roles: Roles) -> None:
    with roles.connect_as(roles.migrator) as conn:
        assert current_user(conn) == roles.migrator
        assert migrate(conn) == []
        assert current_version(conn) == bridge_sql.migrations()[-1].version
        # What a later migration does: change an owned table and add one (here rolled back).
        with conn.transaction(force_rollback=True):
            conn.execute("ALTER TABLE work_item ADD COLUMN probe text")
            conn.execute("CREATE TABLE probe (id int)")
            assert conn.execute("SELECT to_regclass('probe')::text").fetchone() == ("probe",)


def test_the_bridge_role_runs_the_store_protocol(
    roles: Roles, bridge_store: PostgresStore, db: Conn
) -> None:
    with bridge_store.pool.connection() as conn:
        assert current_user(conn) == roles.bridge
    seed(bridge_store)

    claims = {c.key: c for c in bridge_store.claims.claim("worker-1", 10, LEASE)}
    assert set(claims) == {Key("acme", "op-1"), Key("acme", "op-2"), Key("globex", "op-1")}
    done, parked, again = (
        claims[Key("acme", "op-1")],
        claims[Key("globex", "op-1")],
        claims[Key("acme", "op-2")],
    )
    bridge_store.settle.heartbeat(done.ticket, LEASE)
    bridge_store.settle.settle(Settlement(done.ticket, State.SUCCEEDED, "ok"))
    bridge_store.settle.settle(Settlement(parked.ticket, State.UNKNOWN, "ambiguous"))
    bridge_store.settle.retry_later(again.ticket, timedelta(0), "busy")
    redriven = bridge_store.operator.redrive(RedriveFilter(), actor="on-call", reason="reconciled")
    assert [r.key for r in redriven] == [Key("globex", "op-1")]
    assert bridge_store.operator.stats().total(State.QUEUED) == 2

    assert db.execute(
        "SELECT tenant_id, operation_id, state FROM work_item ORDER BY 1, 2"
    ).fetchall() == [
        ("acme", "op-1", "succeeded"),
        ("acme", "op-2", "queued"),
        ("globex", "op-1", "queued"),
    ]
    assert db.execute("SELECT actor, tenant_id FROM redrive_audit").fetchall() == [
        ("on-call", "globex")
    ]


def test_the_bridge_role_can_change_rows_but_not_the_schema_or_the_audit(
    roles: Roles, bridge_store: PostgresStore
) -> None:
    seed(bridge_store)
    denied = [
        "DROP TABLE work_item",
        "ALTER TABLE work_item DISABLE ROW LEVEL SECURITY",
        "DROP POLICY tenant_isolation ON work_item",
        "TRUNCATE work_item",
        "CREATE TABLE side_table (id int)",
        "UPDATE redrive_audit SET reason = 'rewritten'",
        "DELETE FROM redrive_audit",
        "INSERT INTO tenant_role (role_name, tenant_id) VALUES ('someone', 'acme')",
        "SELECT * FROM tenant_role",
        "DELETE FROM fencebridge_migration",
    ]
    with roles.connect_as(roles.bridge) as conn:
        for statement in denied:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
        # Row-level security does not narrow the bridge: it sees every tenant.
        row = conn.execute("SELECT count(DISTINCT tenant_id) FROM work_item").fetchone()
        assert row == (2,)


def test_the_operator_reads_every_tenant_and_writes_nothing(
    roles: Roles, bridge_store: PostgresStore
) -> None:
    seed(bridge_store)
    with roles.connect_as(roles.operator) as conn:
        assert current_user(conn) == roles.operator
        assert conn.execute(
            "SELECT tenant_id, operation_id FROM work_item ORDER BY 1, 2"
        ).fetchall() == [("acme", "op-1"), ("acme", "op-2"), ("globex", "op-1")]
        assert conn.execute(
            "SELECT tenant_id, count(*) FROM payload GROUP BY 1 ORDER BY 1"
        ).fetchall() == [("acme", 2), ("globex", 1)]
        assert conn.execute("SELECT kind, tenant_id FROM rejected_delivery").fetchall() == [
            ("conflict", "acme")
        ]
        for statement in [
            "UPDATE work_item SET state = 'queued'",
            "DELETE FROM payload",
            "INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state,"
            " to_state, fence, attempts) VALUES ('x', 'x', 'acme', 'op-1', 'unknown',"
            " 'queued', 1, 1)",
            "UPDATE rejected_delivery SET redriven_at = now()",
            "TRUNCATE work_item",
        ]:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                bridge_sql.statement("sweep"),
                {"limit": 10, "now": None, "history": 20, "aging": 60.0, "unstarted_claims": 5},
            )

    operator_store = PostgresStore.connect(roles.url_as(roles.operator), max_size=1)
    try:
        stats = operator_store.operator.stats()
    finally:
        operator_store.close()
    assert {(c.tenant_id, c.state, c.count) for c in stats.counts} == {
        ("acme", State.QUEUED, 2),
        ("globex", State.QUEUED, 1),
    }


def test_the_console_role_redrives_and_views_payloads_and_writes_nothing_else(
    roles: Roles, bridge_store: PostgresStore, db: Conn
) -> None:
    seed(bridge_store)
    claims = {c.key: c for c in bridge_store.claims.claim("worker-1", 10, LEASE)}
    bridge_store.settle.settle(
        Settlement(claims[Key("globex", "op-1")].ticket, State.UNKNOWN, "ambiguous")
    )
    bridge_store.settle.settle(
        Settlement(claims[Key("acme", "op-1")].ticket, State.SUCCEEDED, "ok")
    )

    console = PostgresStore.connect(roles.url_as(roles.console), max_size=1)
    try:
        with console.pool.connection() as conn:
            assert current_user(conn) == roles.console
        # It reads every tenant, as the operator does.
        assert {(c.tenant_id, c.state) for c in console.operator.stats().counts} >= {
            ("globex", State.UNKNOWN),
            ("acme", State.SUCCEEDED),
        }
        preview = console.operator.redrive(
            RedriveFilter(), actor="on-call", reason="look", dry_run=True
        )
        assert [r.key for r in preview] == [Key("globex", "op-1")]
        moved = console.operator.redrive(RedriveFilter(), actor="on-call", reason="reconciled")
        assert [r.key for r in moved] == [Key("globex", "op-1")]
        viewed = console.console.view_payload(
            Key("acme", "op-2"), actor="on-call", reason="support"
        )
        assert viewed is not None
        # A quarantined delivery redriven from the console is decoded again through the inbox.
        (fresh,) = console.inbox.ingest([delivery("acme", "op-3")])
        assert fresh.decision is Decision.NEW
    finally:
        console.close()
    assert db.execute(
        "SELECT actor, tenant_id, to_state FROM redrive_audit ORDER BY at"
    ).fetchall() == [("on-call", "globex", "queued"), ("on-call", "acme", "payload_viewed")]

    denied = [
        "DELETE FROM work_item",
        "DELETE FROM payload",
        "UPDATE payload SET body = NULL",
        "UPDATE redrive_audit SET reason = 'rewritten'",
        "DELETE FROM redrive_audit",
        "UPDATE work_attempt SET outcome = NULL",
        "DELETE FROM work_attempt",
        "DELETE FROM rejected_delivery",
        "UPDATE identity_key SET reason = 'rewritten'",
        "TRUNCATE work_item",
        "CREATE TABLE side_table (id int)",
    ]
    with roles.connect_as(roles.console) as conn:
        for statement in denied:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
        # The bridge's own moves are out of its reach: claiming, sweeping, purging, erasing.
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                bridge_sql.statement("claim"),
                {
                    "limit": 10,
                    "now": None,
                    "job_types": None,
                    "identity_keys": None,
                    "worker": "console",
                    "lease": LEASE,
                    "history": 20,
                    "slots": None,
                },
            )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                bridge_sql.statement("sweep"),
                {"limit": 10, "now": None, "history": 20, "aging": 60.0, "unstarted_claims": 5},
            )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "SELECT * FROM fencebridge_erase_under_keys('acme', NULL, 'x', NULL,"
                " ARRAY[1]::smallint[], '{}', '{}', 'x', 'x', false)"
            )


def test_a_tenant_role_sees_only_its_own_tenant(
    roles: Roles, bridge_store: PostgresStore, admin: Conn
) -> None:
    seed(bridge_store)
    acme, globex = f"{roles.prefix}_acme", f"{roles.prefix}_globex"
    # The documented procedure, twice for acme: adding a role is re-runnable.
    admin.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (acme, "acme"))
    admin.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (acme, "acme"))
    admin.execute("SELECT fencebridge_add_tenant_role(%s, %s, login => true)", (globex, "globex"))

    with roles.connect_as(acme) as conn:
        assert conn.execute(
            "SELECT w.tenant_id, w.operation_id, p.body FROM work_item w"
            " JOIN payload p USING (payload_ref) ORDER BY 2"
        ).fetchall() == [("acme", "op-1", b"acme-1"), ("acme", "op-2", b"acme-2")]
        assert conn.execute("SELECT tenant_id FROM rejected_delivery").fetchall() == [("acme",)]
        assert conn.execute("SELECT role_name, tenant_id FROM tenant_role").fetchall() == [
            (acme, "acme")
        ]
        # Naming the other tenant's key explicitly finds nothing either.
        assert (
            conn.execute(
                "SELECT 1 FROM work_item WHERE tenant_id = 'globex' AND operation_id = 'op-1'"
            ).fetchall()
            == []
        )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("UPDATE work_item SET state = 'succeeded'")

    with roles.connect_as(globex) as conn:
        assert conn.execute("SELECT tenant_id, operation_id FROM work_item").fetchall() == [
            ("globex", "op-1")
        ]
        assert conn.execute("SELECT tenant_id FROM rejected_delivery").fetchall() == []

    logins = dict(
        admin.execute(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY (%s)", ([acme, globex],)
        ).fetchall()
    )
    assert logins == {acme: False, globex: True}

    removed = admin.execute("SELECT fencebridge_remove_tenant_role(%s)", (acme,)).fetchone()
    assert removed == (True,)
    with roles.connect_as(acme) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM work_item")


def test_a_tenant_role_maps_to_one_tenant_and_never_bypasses_security(
    roles: Roles, admin: Conn
) -> None:
    acme = f"{roles.prefix}_acme"
    admin.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (acme, "acme"))
    with pytest.raises(errors.RaiseException, match="already mapped to another tenant"):
        admin.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (acme, "globex"))
    for privileged in (roles.bridge, roles.operator, roles.migrator):
        with pytest.raises(errors.RaiseException, match="bypasses row-level security"):
            admin.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (privileged, "acme"))
    rows = admin.execute("SELECT role_name, tenant_id FROM tenant_role").fetchall()
    assert rows == [(acme, "acme")]


def test_a_bad_prefix_is_refused_before_anything_is_created(db_url: str, db: Conn) -> None:
    with pytest.raises(errors.RaiseException, match="role_prefix"):
        apply_roles(db_url, "Not-A-Prefix")
    row = db.execute("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'Not-A-Prefix%'").fetchone()
    assert row == (0,)


def test_the_bridge_role_records_its_key_and_erases_with_tombstones(
    roles: Roles, bridge_store: PostgresStore, db: Conn
) -> None:
    """A first use records the key through the trigger that makes new keys wait for erasures;
    the erasure writes tombstones and marks no key (it holds the only one)."""
    hasher = IdentityHasher(b"roles-test-identity-key-000000001")
    keyring.attach(bridge_store.keys, hasher, used_by="test")
    seed(bridge_store)
    for claim in bridge_store.claims.claim("worker-1", 10, LEASE):
        bridge_store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    counts = erase_operation(bridge_store, hasher, "acme", "op-1")
    assert (counts.work_rows, counts.tombstones, counts.missed_keys) == (1, 1, ())
    assert db.execute("SELECT key_id FROM erased_operation").fetchall() == [(1,)]


@pytest.mark.slow
def test_the_erasure_without_tombstones_is_revoked_until_its_migration_drops_it(
    pg_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fencebridge_erase_tenant erased a tenant without tombstones: a redelivery of what it
    erased became new work. roles.sql takes it from the bridge on a database not migrated past
    0023 yet, and 0024 drops it."""
    name, prefix = unique_name("fbt_retired"), f"fbroles_{secrets.token_hex(4)}"
    url = create_database(pg_admin_url, name)
    signature = "fencebridge_erase_tenant(text, text, text, text)"
    try:
        shipped = bridge_sql.migrations()
        with monkeypatch.context() as m:
            m.setattr(bridge_sql, "migrations", lambda: [v for v in shipped if v.version < 24])
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
        apply_roles(url, prefix)
        roles = Roles(prefix, url)
        with psycopg.connect(url, autocommit=True) as conn:
            allowed = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'),"
                " has_function_privilege(%s, 'fencebridge_erase(text, text, text, text,"
                " smallint, text[], bytea[], text, text)', 'EXECUTE')",
                (roles.bridge, signature, roles.bridge),
            ).fetchone()
            assert allowed == (False, True)
            migrate(conn)
            assert conn.execute("SELECT to_regprocedure(%s)", (signature,)).fetchone() == (None,)
        apply_roles(url, prefix)  # runs on the migrated database as before
    finally:
        drop_roles(url, prefix)
        drop_database(pg_admin_url, name)
