"""The inbox's one-round-trip write of a batch, new operations and keys that existed alike, and
its way back to the careful write whenever a key could not be decided in one statement:
tombstones, races between writers, a cut connection, a failure between its two statements."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from bridge import keyring
from bridge.errors import StoreError, StoreUnavailable
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.ingest import CONFLICT_REASON
from bridge.store.work import Settlement
from bridge.types import Decision, IngestResult, State
from tests.support.deliveries import delivery
from tests.support.erasure import erase_operation
from tests.support.frontend import frontend_messages
from tests.support.proxy import Proxy
from tests.support.waiting import eventually

Db = psycopg.Connection[tuple[Any, ...]]
HASHER = IdentityHasher(b"inbox-new-batches-identity-key-0123")


@pytest.fixture
def single(db_url: str) -> Iterator[PostgresStore]:
    """A store on a pool of one connection: every call goes through the traced one."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1)
    yield store
    store.close()


def test_a_batch_of_new_operations_is_one_round_trip_with_no_begin_or_commit(
    single: PostgresStore, db: Db
) -> None:
    batch = [delivery(f"op-{i}", tenant=f"t{i % 3}") for i in range(10)]
    results: list[IngestResult] = []
    sent = frontend_messages(single, lambda: results.extend(single.inbox.ingest(batch)))
    assert [r.decision for r in results] == [Decision.NEW] * 10
    # The insert and its check in one statement, closed by one Sync; no simple query.
    assert sent["Sync"] == 1, sent
    assert sent["Query"] == 0, sent
    assert sent["Execute"] == 1, sent
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (10,)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (10,)


def test_a_batch_with_existing_keys_is_decided_in_one_round_trip_and_nothing_doubles(
    single: PostgresStore, db: Db
) -> None:
    single.inbox.ingest([delivery("op-1"), delivery("op-2", payload=b'{"amount": 1}')])
    batch = [
        delivery("op-0"),
        delivery("op-1"),  # a replay
        delivery("op-2", payload=b'{"amount": 2}'),  # a conflict
        delivery("op-3"),
        delivery("op-0"),  # a replay of a key this batch inserts
    ]
    results: list[IngestResult] = []
    sent = frontend_messages(single, lambda: results.extend(single.inbox.ingest(batch)))
    assert [(r.decision, r.state) for r in results] == [
        (Decision.NEW, State.QUEUED),
        (Decision.REPLAY, State.QUEUED),
        (Decision.CONFLICT, State.QUEUED),
        (Decision.NEW, State.QUEUED),
        (Decision.REPLAY, State.QUEUED),
    ]
    # The insert, the decisions, their records and the check in one statement, closed by one
    # Sync; no BEGIN or COMMIT.
    assert sent["Sync"] == 1, sent
    assert sent["Query"] == 0, sent
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (4,)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (4,)
    copies = db.execute(
        "SELECT operation_id, count(*) FROM delivery_copy GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert copies == [("op-0", 1), ("op-1", 1)]
    rejected = db.execute(
        "SELECT kind, reason, tenant_id, operation_id, payload_hash, payload_ref"
        " FROM rejected_delivery"
    ).fetchall()
    assert rejected == [
        ("conflict", CONFLICT_REASON, "t1", "op-2", batch[2].payload_hash, None),
    ]


def test_a_refused_batch_is_no_rollback_and_the_prepared_statements_survive(
    single: PostgresStore, db: Db
) -> None:
    """A batch holding an erased key is refused by the one statement (a tombstone) and written
    the careful way: the refusal fails one autocommit statement, never a ROLLBACK, which would
    make psycopg forget the connection's prepared statements."""
    keyring.attach(single.keys, HASHER, used_by="test")
    single.inbox.ingest([delivery("gone")])
    [claim] = single.claims.claim("w", 1, timedelta(seconds=30))
    single.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    erase_operation(single, HASHER, "t1", "gone")
    for i in range(8):
        results = single.inbox.ingest([delivery(f"again-{i}"), delivery("gone")])
        assert [(r.decision, r.erased) for r in results] == [
            (Decision.NEW, False),
            (Decision.REPLAY, True),
        ]
    with single.pool.connection() as conn:
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared is not None
    assert prepared[0] >= 2
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (8,)


@pytest.mark.promise("erasure-keeps-dedupe")
def test_an_erased_key_in_a_batch_of_new_ones_is_a_replay_and_the_rest_is_new(
    store: PostgresStore, db: Db
) -> None:
    keyring.attach(store.keys, HASHER, used_by="test")
    store.inbox.ingest([delivery("gone", tenant="t1")])
    [claim] = store.claims.claim("w", 1, timedelta(seconds=30))
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    erase_operation(store, HASHER, "t1", "gone")
    results = store.inbox.ingest([delivery("new-1", tenant="t1"), delivery("gone", tenant="t1")])
    assert [r.decision for r in results] == [Decision.NEW, Decision.REPLAY]
    assert results[1].erased
    rows = db.execute("SELECT operation_id FROM work_item ORDER BY 1").fetchall()
    assert rows == [("new-1",)]


def test_a_batch_whose_check_cannot_be_sent_commits_nothing(
    single: PostgresStore, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check's parameters cannot be adapted: the statement is never sent.
    unsendable = {"key_id": [object()], "operation_hash": [], "any_erased": False}
    monkeypatch.setattr(single.inbox, "_tombstone_hashes", lambda keys: unsendable)
    with pytest.raises(StoreError, match="cannot adapt"):
        single.inbox.ingest([delivery("op-1"), delivery("op-2")])
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (0,)
    monkeypatch.undo()
    assert [r.decision for r in single.inbox.ingest([delivery("op-1")])] == [Decision.NEW]


def waiting_on(db: Db, lock: str) -> bool:
    """Whether a backend of this test's database waits on a lock of that kind (``relation``:
    a table; ``transactionid``: another transaction's end, as on a row it must insert). Other
    tests' databases on the same server are not looked at."""
    found = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND wait_event = %s",
        (lock,),
    ).fetchone()
    return bool(found and found[0])


def test_an_erasure_that_commits_while_the_insert_waits_on_its_row_is_seen(
    db_url: str, db: Db
) -> None:
    """A batch written while an erasure of one of its operations is under way: the insert
    waits on the row the erasure deleted, the erasure commits its tombstone, and the insert
    goes on. The check, on a snapshot taken after that wait, sees the tombstone: the batch is
    written the careful way, the erased operation a replay and never new work."""
    store = PostgresStore.connect(db_url, min_size=2, max_size=4)
    # Holds the erasure after it deleted the row and wrote the tombstone, before it commits:
    # it waits for this lock on a table it deletes from later.
    blocker = psycopg.connect(db_url)
    try:
        keyring.attach(store.keys, HASHER, used_by="test")
        store.inbox.ingest([delivery("erased", tenant="t1")])
        claims = store.claims.claim("w1", 10, timedelta(seconds=30))
        store.settle.settle_many(
            [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in claims]]
        )
        blocker.execute("LOCK TABLE shadow_delivery IN ACCESS EXCLUSIVE MODE")
        erased: list[object] = []
        eraser = threading.Thread(
            target=lambda: erased.append(erase_operation(store, HASHER, "t1", "erased"))
        )
        eraser.start()
        eventually(lambda: waiting_on(db, "relation"), "the erasure waits on the blocker")
        results: list[IngestResult] = []
        batch = [delivery("erased", tenant="t1"), delivery("other", tenant="t1")]
        writer = threading.Thread(target=lambda: results.extend(store.inbox.ingest(batch)))
        writer.start()
        eventually(lambda: waiting_on(db, "transactionid"), "the insert waits on the erasure")
        blocker.rollback()  # the erasure goes on and commits; then the insert goes on
        eraser.join(30)
        writer.join(30)
    finally:
        blocker.close()  # a failed wait above must not leave the erasure blocked
        store.close()
    assert len(erased) == 1
    assert [(r.decision, r.erased) for r in results] == [
        (Decision.REPLAY, True),
        (Decision.NEW, False),
    ]
    rows = db.execute("SELECT operation_id FROM work_item ORDER BY 1").fetchall()
    assert rows == [("other",)]


def through(proxy: Proxy, url: str) -> str:
    return conninfo.make_conninfo(url, host=proxy.host, port=str(proxy.port))


@pytest.mark.slow
def test_racing_writers_with_duplicates_conflicts_and_a_cut_create_each_operation_once(
    cluster_db_url: str, proxy: Proxy
) -> None:
    """Three writers deliver 1,200 operations each, in batches of 10 in different orders (every
    key by every writer: the one-round-trip writes race each other on the same keys), one of
    them with a changed payload for every fifth key; the proxy is cut while batches are in
    flight, and a batch whose write failed is delivered again, as a broker redelivers what was
    not acknowledged."""
    url = cluster_db_url
    store = PostgresStore.connect(through(proxy, url), min_size=3, max_size=3)
    keys = [f"op-{i}" for i in range(1200)]
    changed = set(keys[::5])
    decisions: Counter[Decision] = Counter()
    failures: list[BaseException] = []
    redelivered: list[int] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        order = keys if index != 1 else list(reversed(keys))
        for start in range(0, len(order), 10):
            batch = [
                delivery(k, tenant=f"t{int(k[3:]) % 4}", payload=b"changed")
                if index == 2 and k in changed
                else delivery(k, tenant=f"t{int(k[3:]) % 4}")
                for k in order[start : start + 10]
            ]
            while True:
                try:
                    results = store.inbox.ingest(batch)
                    break
                except StoreUnavailable:
                    with lock:
                        redelivered.append(index)
                except BaseException as exc:  # noqa: BLE001  (asserted below)
                    failures.append(exc)
                    return
            with lock:
                decisions.update(r.decision for r in results)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        eventually(lambda: decisions.total() >= 1200, "a third of the deliveries")
        proxy.stop()  # cuts the writers' connections, statements in flight among them
        proxy.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        store.close()
    assert not failures, failures
    assert redelivered, "the cut failed no write"
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT count(*), count(DISTINCT (tenant_id, operation_id)) FROM work_item"
        ).fetchone()
        payloads = db.execute("SELECT count(*) FROM payload").fetchone()
        orphans = db.execute(
            "SELECT count(*) FROM payload p"
            " WHERE NOT EXISTS (SELECT 1 FROM work_item w WHERE w.payload_ref = p.payload_ref)"
        ).fetchone()
        recorded = db.execute("SELECT count(*) FROM rejected_delivery").fetchone()
    assert rows == (1200, 1200)
    assert payloads == (1200,)
    assert orphans == (0,)
    # Each key was new once; a batch cut after its commit came back as replays.
    assert 1200 - 10 * len(redelivered) <= decisions[Decision.NEW] <= 1200
    assert decisions.total() == 3 * 1200
    # A changed key disagrees with one writer (its payload lost the race) or two (it won).
    assert len(changed) <= decisions[Decision.CONFLICT] <= 2 * len(changed)
    assert recorded is not None
    assert recorded[0] >= decisions[Decision.CONFLICT]
