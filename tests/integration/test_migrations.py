"""Schema migrations: all at once, one at a time, twice, concurrently, and refusals.

The upgrade-path test is written over ``bridge.sql.migrations()``, so every migration added
later is checked against the same promise: applying the versions one release at a time ends in
exactly the catalog that a fresh install gets.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from bridge import sql
from bridge.errors import MigrationError, StoreError
from bridge.migrate import Applied, current_version, migrate, require_current
from tests.support.postgres import create_database, drop_database, unique_name

Db = psycopg.Connection[tuple[Any, ...]]
Snapshot = dict[str, list[tuple[Any, ...]]]

CATALOG: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity, c.reloptions,
               c.relacl::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public'
    """,
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relkind IN ('r', 'p', 'v', 'm')
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = 'public'
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
    """,
    "policies": """
        SELECT tablename, policyname, permissive, roles::text, cmd, qual, with_check
          FROM pg_policies WHERE schemaname = 'public'
    """,
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t WHERE NOT t.tgisinternal
    """,
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid), p.proacl::text
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public'
    """,
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, cycle
          FROM pg_sequences WHERE schemaname = 'public'
    """,
    "migrations": "SELECT version, name, checksum FROM fencebridge_migration",
}


def snapshot(conn: Db) -> Snapshot:
    """The parts of the catalog a migration defines, in a comparable form."""
    taken: Snapshot = {}
    for name, query in CATALOG.items():
        if name == "migrations" and current_version(conn) == 0:
            taken[name] = []
            continue
        rows = conn.execute(query).fetchall()  # type: ignore[call-overload]
        taken[name] = sorted(rows, key=repr)
    return taken


@pytest.fixture
def empty_database(pg_admin_url: str) -> Iterator[Callable[[], Db]]:
    """Makes empty databases (no migration applied); drops them at the end of the test."""
    names: list[str] = []
    conns: list[Db] = []

    def make() -> Db:
        name = unique_name("fbt_mig")
        url = create_database(pg_admin_url, name)
        names.append(name)
        conn: Db = psycopg.connect(url, autocommit=True)
        conns.append(conn)
        return conn

    try:
        yield make
    finally:
        for conn in conns:
            conn.close()
        for name in names:
            drop_database(pg_admin_url, name)


def every() -> list[Applied]:
    return [Applied(m.version, m.name) for m in sql.migrations()]


def test_migrate_applies_every_migration_and_records_it(
    empty_database: Callable[[], Db],
) -> None:
    conn = empty_database()
    assert current_version(conn) == 0
    assert migrate(conn) == every()
    recorded = conn.execute(
        "SELECT version, name, checksum FROM fencebridge_migration ORDER BY version"
    ).fetchall()
    assert recorded == [
        (m.version, m.name, hashlib.sha256(m.sql.encode()).hexdigest()) for m in sql.migrations()
    ]
    assert current_version(conn) == sql.migrations()[-1].version
    require_current(conn)
    made = {r[0] for r in snapshot(conn)["relations"] if r[1] == "r"}
    assert {"work_item", "payload", "rejected_delivery", "redrive_audit", "tenant_role"} <= made


def test_migrating_again_is_a_no_op(empty_database: Callable[[], Db]) -> None:
    conn = empty_database()
    migrate(conn)
    before = snapshot(conn)
    assert migrate(conn) == []
    assert snapshot(conn) == before


def test_one_migration_at_a_time_ends_where_all_at_once_does(
    empty_database: Callable[[], Db], monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = sql.migrations()
    fresh = empty_database()
    migrate(fresh)

    upgraded = empty_database()
    for released in range(1, len(shipped) + 1):
        # This release of fencebridge ships the first `released` migrations.
        with monkeypatch.context() as m:
            m.setattr(sql, "migrations", lambda n=released: shipped[:n])
            step = shipped[released - 1]
            assert migrate(upgraded) == [Applied(step.version, step.name)]
            require_current(upgraded)
            assert migrate(upgraded) == []
        if released < len(shipped):
            with pytest.raises(MigrationError, match="run `fencebridge migrate`"):
                require_current(upgraded)  # the newest code refuses the older schema

    assert sql.migrations() == shipped
    assert migrate(upgraded) == []
    assert snapshot(upgraded) == snapshot(fresh)


def migrate_at_once(conns: list[Db]) -> tuple[list[list[Applied]], list[BaseException]]:
    """Start ``migrate`` on every connection at the same moment; (results, errors)."""
    barrier = threading.Barrier(len(conns))
    results: list[list[Applied]] = []
    errors: list[BaseException] = []

    def run(conn: Db) -> None:
        try:
            barrier.wait(10)
            results.append(migrate(conn))
        except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


def test_two_migrators_at_once_both_succeed_and_one_applies(
    empty_database: Callable[[], Db],
) -> None:
    reference = empty_database()
    migrate(reference)
    expected = snapshot(reference)

    for _ in range(3):
        first = empty_database()
        with psycopg.connect(first.info.dsn, autocommit=True) as second:
            results, errors = migrate_at_once([first, second])
        assert errors == []
        assert sorted(results, key=len) == [[], every()]
        assert snapshot(first) == expected


def test_a_changed_migration_is_refused(empty_database: Callable[[], Db]) -> None:
    conn = empty_database()
    migrate(conn)
    conn.execute("UPDATE fencebridge_migration SET checksum = 'edited' WHERE version = 1")
    before = snapshot(conn)
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(conn)
    assert snapshot(conn) == before


def test_an_unknown_newer_migration_is_refused(empty_database: Callable[[], Db]) -> None:
    conn = empty_database()
    migrate(conn)
    newer = sql.migrations()[-1].version + 1
    conn.execute(
        "INSERT INTO fencebridge_migration (version, name, checksum) VALUES (%s, 'later', 'x')",
        (newer,),
    )
    before = snapshot(conn)
    with pytest.raises(MigrationError, match="upgrade fencebridge"):
        migrate(conn)
    with pytest.raises(MigrationError, match="newer than this fencebridge"):
        require_current(conn)
    assert snapshot(conn) == before


def test_require_current_refuses_an_unmigrated_database(
    empty_database: Callable[[], Db],
) -> None:
    conn = empty_database()
    with pytest.raises(MigrationError, match="run `fencebridge migrate` first"):
        require_current(conn)
    conn.execute(sql.statement("migration_table"))  # the record exists, but is empty
    assert current_version(conn) == 0
    with pytest.raises(MigrationError, match="version 0"):
        require_current(conn)


def test_a_failing_migration_applies_nothing(empty_database: Callable[[], Db]) -> None:
    conn = empty_database()
    conn.execute("CREATE TABLE payload (x integer)")  # in the way of the first migration
    with pytest.raises(StoreError, match='relation "payload" already exists'):
        migrate(conn)
    assert current_version(conn) == 0
    assert conn.execute("SELECT to_regclass('work_item')").fetchone() == (None,)
