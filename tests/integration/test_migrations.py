"""Schema migrations: all at once, one at a time, twice, concurrently, and refusals.

The upgrade-path test is written over ``bridge.sql.migrations()``, so every migration added
later is checked against the same promise: applying the versions one release at a time ends in
exactly the catalog that a fresh install gets.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tenacity import wait_fixed

from bridge import sql
from bridge.errors import MigrationError, StoreError
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.store.migrate import (
    RELEASED_CHECKSUMS,
    Applied,
    current_version,
    migrate,
    require_current,
)
from bridge.types import Claim, State
from tests.support.deliveries import for_job
from tests.support.postgres import create_database, drop_database, unique_name
from tests.support.waiting import eventually

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.promise("live-migration")
def test_a_failing_migration_applies_nothing(empty_database: Callable[[], Db]) -> None:
    conn = empty_database()
    conn.execute("CREATE TABLE payload (x integer)")  # in the way of the first migration
    with pytest.raises(StoreError, match='relation "payload" already exists'):
        migrate(conn)
    assert current_version(conn) == 0
    assert conn.execute("SELECT to_regclass('work_item')").fetchone() == (None,)


# -- safe on a live table ------------------------------------------------------------------------

RELEASED = Path(__file__).parent / "released"
#: a tenacity wait that hardly waits: the retries, not the pauses, are under test
NO_PAUSE = wait_fixed(0.02)


def at_version(conn: Db, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migrate ``conn`` as the release that shipped the first ``version`` migrations did."""
    shipped = sql.migrations()
    with monkeypatch.context() as m:
        m.setattr(sql, "migrations", lambda: shipped[:version])
        migrate(conn)
    assert current_version(conn) == version


def without_checksums(taken: Snapshot) -> Snapshot:
    return {**taken, "migrations": [row[:2] for row in taken["migrations"]]}


@pytest.mark.slow
def test_class_c_rows_an_earlier_release_attempted_are_marked_as_possibly_sent(
    empty_database: Callable[[], Db], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = empty_database()
    at_version(conn, 5, monkeypatch)
    rows = [
        # (operation, class, state, attempts): what the release before 0006 left behind
        ("c-retry", "C", "queued", 1),
        ("c-running", "C", "claimed", 2),
        ("c-fresh", "C", "queued", 0),
        ("c-done", "C", "succeeded", 1),
        ("b-retry", "B", "queued", 1),
        ("d-redriven", "D", "queued", 1),
    ]
    for operation, target_class, state, attempts in rows:
        conn.execute(
            "INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,"
            " payload_hash, payload_ref, state, fence, attempts, lease_expires_at)"
            " VALUES ('t1', %s, 'orders', 'job', %s, sha256('x'), 'ref', %s, %s, %s,"
            " CASE WHEN %s = 'claimed' THEN now() END)",
            (operation, target_class, state, attempts, attempts, state),
        )
    conn.commit()

    migrate(conn)

    marked = dict(
        conn.execute("SELECT operation_id, intent_fence FROM work_item ORDER BY 1").fetchall()
    )
    # In flight and attempted under class C: its later claims park it unknown if the lookup
    # cannot tell. Nothing else changes.
    assert marked == {
        "b-retry": None,
        "c-done": None,
        "c-fresh": None,
        "c-retry": 1,
        "c-running": 2,
        "d-redriven": None,
    }


def test_after_the_first_migration_indexes_are_built_concurrently_outside_a_transaction() -> None:
    builds = re.compile(r"CREATE\s+(UNIQUE\s+)?INDEX\s", re.IGNORECASE)
    for migration in sql.migrations()[1:]:
        for statement in migration.statements():
            if builds.match(statement):
                assert not migration.transactional, migration.name
                assert "CONCURRENTLY" in statement.upper(), migration.name


@pytest.mark.slow
def test_a_database_that_applied_the_released_0002_stays_valid_and_is_not_migrated_again(
    empty_database: Callable[[], Db], monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = empty_database()
    migrate(fresh)

    released = RELEASED.joinpath("0002_operations.sql").read_text("utf-8")
    checksum = hashlib.sha256(released.encode()).hexdigest()
    assert checksum in RELEASED_CHECKSUMS[2]
    assert released != sql.migrations()[1].sql, "0002 changed since its release"
    old = empty_database()
    at_version(old, 1, monkeypatch)
    with old.transaction():  # as the runner of that release applied it
        old.execute(released.encode())
        old.execute(
            "INSERT INTO fencebridge_migration (version, name, checksum) VALUES (2, %s, %s)",
            ("operations", checksum),
        )

    assert migrate(old) == every()[2:]
    assert migrate(old) == []
    require_current(old)
    recorded = old.execute("SELECT checksum FROM fencebridge_migration WHERE version = 2")
    assert recorded.fetchone() == (checksum,), "the record of what was applied is kept"
    assert without_checksums(snapshot(old)) == without_checksums(snapshot(fresh))


@pytest.mark.slow
def test_an_invalid_index_left_by_an_interrupted_concurrent_build_is_built_again(
    empty_database: Callable[[], Db],
) -> None:
    conn = empty_database()
    migrate(conn)
    expected = snapshot(conn)
    # An interrupted CREATE INDEX CONCURRENTLY leaves the index behind, marked invalid, and
    # its migration unrecorded.
    conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'work_item_terminal'::regclass"
    )
    conn.execute("DELETE FROM fencebridge_migration WHERE version = 3")

    assert migrate(conn) == [Applied(3, "terminal_index")]
    valid = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'work_item_terminal'::regclass"
    )
    assert valid.fetchone() == (True,)
    assert snapshot(conn) == expected


@pytest.mark.slow
@pytest.mark.promise("live-migration")
def test_a_migration_waiting_for_a_lock_gives_way_so_the_table_stays_usable_then_applies(
    empty_database: Callable[[], Db],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = empty_database()
    at_version(conn, 1, monkeypatch)
    url = conn.info.dsn
    with (
        psycopg.connect(url, autocommit=True) as holder,
        psycopg.connect(url, autocommit=True) as probe,
    ):
        # A long report holds a lock that 0002's ALTER TABLE must wait for.
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM rejected_delivery")
        results: list[list[Applied]] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with psycopg.connect(url, autocommit=True) as mine:
                    results.append(
                        migrate(
                            mine,
                            lock_timeout=timedelta(milliseconds=100),
                            attempts=10_000,
                            wait=NO_PAUSE,
                        )
                    )
            except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
                errors.append(exc)

        caplog.set_level(logging.INFO, logger="bridge.store.migrate")
        migrator = threading.Thread(target=run)
        migrator.start()
        eventually(lambda: "gave way" in caplog.text, "the migrator gave way at least once")

        def readable() -> bool:
            # Without a lock timeout the migrator's waiting ALTER TABLE would queue this
            # read behind it for as long as the report runs.
            try:
                with probe.transaction():
                    probe.execute("SET LOCAL lock_timeout = '50ms'")
                    probe.execute("SELECT count(*) FROM rejected_delivery")
            except psycopg.errors.LockNotAvailable:
                return False
            return True

        eventually(readable, "the bridge's table readable while the migration waits", 30)
        assert current_version(probe) == 1, "nothing applied while it gives way"
        holder.execute("COMMIT")
        migrator.join(60)
    assert errors == []
    assert results == [every()[1:]]


@pytest.mark.slow
def test_a_migration_that_never_gets_its_locks_gives_up_clearly_and_applies_nothing(
    empty_database: Callable[[], Db], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = empty_database()
    at_version(conn, 1, monkeypatch)
    with psycopg.connect(conn.info.dsn, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE rejected_delivery IN ACCESS SHARE MODE")
        with pytest.raises(MigrationError, match=r"migration 2 \(operations\) did not get its"):
            migrate(conn, lock_timeout=timedelta(milliseconds=50), attempts=3, wait=NO_PAUSE)
        holder.execute("ROLLBACK")
    assert current_version(conn) == 1
    columns = conn.execute(
        "SELECT count(*) FROM information_schema.columns"
        " WHERE table_name = 'rejected_delivery' AND column_name = 'redriven_by'"
    )
    assert columns.fetchone() == (0,)
    assert migrate(conn) == every()[1:]


# -- a million rows, a bridge at work -------------------------------------------------------------

HISTORY_ROWS = 1_000_000
QUEUED_ROWS = 20_000

FILL_HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, fence, attempts, outcome_code,
                       created_at, updated_at, next_attempt_at, claimed_at, settled_at)
SELECT 'history', 'op-' || g, 'jobs', 'quick', 'B', sha256(g::text::bytea), 'history:' || g,
       'succeeded', 1, 1, 'ok', t, t, t, t, t
  FROM generate_series(1, %(n)s::int) AS g,
       LATERAL (SELECT now() - interval '30 days' + g * interval '1 second') AS at(t)
"""


class Quick(ConditionalWriteHandler):
    """Succeeds after a moment of work, so the queue lasts through the migration."""

    def handle(self, ctx: Context) -> None:
        time.sleep(0.002)


class SettledAt:
    """Records when each settlement was reported (monotonic clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []

    def claimed(self, claim: Claim) -> None:
        pass

    def settled(self, claim: Claim, state: State, code: str) -> None:
        with self.lock:
            self.times.append(time.monotonic())

    def lease_lost(self, claim: Claim, action: str) -> None:
        pass

    def fenced_out(self, claim: Claim) -> None:
        pass

    def reconciled(self, claim: Claim, finding: str) -> None:
        pass

    def settle_unknown(self, claim: Claim, action: str) -> None:
        pass

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        pass

    def count(self) -> int:
        with self.lock:
            return len(self.times)

    def between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.times if start <= t <= end)


class IndexBuildWatch:
    """Watches ``pg_stat_progress_create_index`` from a session of its own and counts the
    settlements reported while an index build was in progress."""

    def __init__(self, url: str, settled: SettledAt) -> None:
        self._url = url
        self._settled = settled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self.seen = False
        self.settled_during = 0

    def __enter__(self) -> IndexBuildWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        first: int | None = None
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                building = conn.execute(
                    "SELECT count(*) FROM pg_stat_progress_create_index"
                    " WHERE datname = current_database()"
                ).fetchone()
                now = self._settled.count()
                if building and building[0]:
                    self.seen = True
                    first = now if first is None else first
                    self.settled_during = now - first
                time.sleep(0.005)


@pytest.mark.slow
def test_migrating_a_million_row_table_while_a_bridge_claims_and_settles(
    empty_database: Callable[[], Db], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = empty_database()
    # The bridge below is this release's code: besides the first migration, the database needs
    # the columns and tables its statements read (0004's identity key id, 0007's attempt
    # history, 0009's rate limit waits, and 0002, whose erasure function 0009 replaces,
    # 0011's concurrency room function, which the claims name, 0012's claim order columns, and
    # 0014's tombstones, which the inbox reads, 0023's check, which its one-round-trip
    # write of new operations calls, 0029's fence epoch, which every claim counts from, and
    # 0030's replay count, which it writes on a replay); the rest, indexes built concurrently
    # among them, is migrated under it.
    shipped = sql.migrations()
    first = [m for m in shipped if m.version in (1, 2, 4, 7, 9, 11, 12, 14, 23, 29, 30)]
    with monkeypatch.context() as m:
        m.setattr(sql, "migrations", lambda: tuple(first))
        migrate(conn)
    conn.execute(FILL_HISTORY.encode(), {"n": HISTORY_ROWS})
    registry = Registry()
    registry.register("quick", Quick())
    store = PostgresStore.connect(conn.info.dsn, max_size=8)
    try:
        for start in range(0, QUEUED_ROWS, 1000):
            store.inbox.ingest(
                [for_job(registry, "quick", f"live-{i}") for i in range(start, start + 1000)]
            )
        conn.execute("VACUUM ANALYZE work_item")
        settled = SettledAt()
        pool = WorkerPool(
            store,
            registry,
            IdentityHasher(b"migration-tests-identity-secret"),
            threads=4,
            poll_interval=0.05,
            events=settled,
        )
        pool.start()
        try:
            eventually(lambda: settled.count() >= 100, "the bridge settling work")
            began = time.monotonic()
            with IndexBuildWatch(conn.info.dsn, settled) as watch:
                applied = migrate(conn)
            ended = time.monotonic()
            during = settled.between(began, ended)
            after = settled.count()
            eventually(lambda: settled.count() > after, "the bridge still settling after it")
        finally:
            pool.stop(deadline=10)
    finally:
        store.close()

    assert applied == [Applied(m.version, m.name) for m in shipped if m not in first]
    require_current(conn)
    assert during > 0, "claims and settlements went on while the migration ran"
    valid = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'work_item_terminal'::regclass"
    )
    assert valid.fetchone() == (True,)
    states = dict(
        conn.execute(
            "SELECT state, count(*) FROM work_item WHERE tenant_id = 't1' GROUP BY state"
        ).fetchall()
    )
    assert set(states) <= {"queued", "succeeded"}, "nothing failed, parked or left claimed"
    assert states["succeeded"] == settled.count()
    # While the index was being built over the million rows, the bridge kept settling: a
    # build inside the migration's transaction would have held every claim and settlement.
    assert watch.seen, "the index build was observed"
    assert watch.settled_during >= 10
