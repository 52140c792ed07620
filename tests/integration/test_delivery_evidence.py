"""Delivery evidence per operation (migration 0030): a thousand operations delivered with
duplicates (inside a batch and across batches) and conflicts, each operation's copies, replays
and conflicts counted exactly, and ``inspect`` and the console reading the same evidence; a
batch that fails midway counts nothing, and its redelivery counts once."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg

from bridge import keyring
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, Key, State, TargetClass

Db = psycopg.Connection[Any]
OPERATIONS = 1000


def delivery(i: int, note: str = "") -> Delivery:
    return Delivery(
        tenant_id=f"tenant-{i % 7}",
        operation_id=f"op-{i}",
        subscription="orders",
        job_type="charge",
        target_class=TargetClass.C,
        payload=json.dumps({"n": i, "note": note}).encode(),
    )


def test_every_copy_of_a_thousand_operations_is_counted(store: PostgresStore, db: Db) -> None:
    chance = random.Random(42)
    sent: list[Delivery] = []
    for i in range(OPERATIONS):
        sent.append(delivery(i))
        if chance.random() < 0.3:  # a duplicate, soon after or much later
            sent.insert(chance.randrange(len(sent) - 1, len(sent) + 1), delivery(i))
        if chance.random() < 0.05:
            sent.append(delivery(i, note="changed"))
    late = [delivery(i) for i in chance.sample(range(OPERATIONS), 100)]
    sent += late
    for start in range(0, len(sent), 10):
        store.inbox.ingest(sent[start : start + 10])

    copies = Counter((d.key, d.payload) for d in sent)
    expected: dict[Key, tuple[int, int]] = {}
    for (key, payload), n in copies.items():
        replays, conflicts = expected.get(key, (0, 0))
        if b"changed" in payload:
            expected[key] = (replays, conflicts + n)
        else:
            expected[key] = (replays + n - 1, conflicts)
    counted = {
        Key(t, o): (replays, conflicts)
        for t, o, replays, conflicts in db.execute(
            "SELECT w.tenant_id, w.operation_id,"
            " (SELECT count(*) FROM delivery_copy c WHERE c.tenant_id = w.tenant_id"
            "   AND c.operation_id = w.operation_id),"
            " (SELECT count(*) FROM rejected_delivery r WHERE r.tenant_id = w.tenant_id"
            "   AND r.operation_id = w.operation_id AND r.kind = 'conflict')"
            " FROM work_item w"
        )
    }
    assert counted == expected
    assert sum(r for r, _ in counted.values()) > 300
    assert sum(c for _, c in counted.values()) > 30

    busiest = max(expected, key=lambda k: sum(expected[k]))
    evidence = store.operator.evidence(busiest)
    assert (evidence.replays, evidence.conflicts) == expected[busiest]
    assert evidence.copies == 1 + sum(expected[busiest])
    assert evidence.first_seen is not None
    assert evidence.last_seen is not None
    assert evidence.first_seen <= evidence.last_seen


def test_a_batch_that_fails_counts_nothing_and_its_redelivery_counts_once(
    store: PostgresStore, db: Db, db_url: str
) -> None:
    store.inbox.ingest([delivery(1), delivery(2)])
    batch = [delivery(1), delivery(2), delivery(3)]
    failed: list[BaseException] = []

    def ingest() -> None:
        try:
            store.inbox.ingest(batch)
        except Exception as exc:  # noqa: BLE001  (the fault this test makes)
            failed.append(exc)

    # the fault: the batch's transaction is killed while it waits on a replayed row's lock
    with psycopg.connect(db_url, autocommit=False) as holder:
        holder.execute("SELECT 1 FROM work_item WHERE operation_id = 'op-2' FOR UPDATE")
        writer = threading.Thread(target=ingest)
        writer.start()
        deadline = time.monotonic() + 30
        waiting: list[tuple[Any, ...]] = []
        while not waiting and time.monotonic() < deadline:
            waiting = holder.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert waiting, "the batch never waited on the locked row"
        holder.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
        holder.rollback()
        writer.join(30)
    assert len(failed) == 1
    assert db.execute("SELECT count(*) FROM delivery_copy").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (2,)

    store.inbox.ingest(batch)  # the broker delivers the batch again

    assert db.execute(
        "SELECT w.operation_id, count(c.id) FROM work_item w"
        " LEFT JOIN delivery_copy c USING (tenant_id, operation_id)"
        " GROUP BY w.operation_id ORDER BY w.operation_id"
    ).fetchall() == [("op-1", 1), ("op-2", 1), ("op-3", 0)]


def test_the_copies_go_with_their_row_when_it_is_purged_or_erased(
    store: PostgresStore, db: Db
) -> None:
    ops = [delivery(i) for i in range(14)]  # tenants 0..6, two operations each
    store.inbox.ingest(ops)
    store.inbox.ingest(ops)  # every one replayed once
    for claim in store.claims.claim("w", len(ops), timedelta(minutes=5)):
        store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    assert db.execute("SELECT count(*) FROM delivery_copy").fetchone() == (14,)
    db.execute(
        "UPDATE work_item SET settled_at = now() - interval '100 days'"
        " WHERE tenant_id IN ('tenant-0', 'tenant-1')"
    )

    counts = store.operator.purge_batch(timedelta(days=30), 100)
    assert counts is not None
    assert counts.work_rows == 4
    hasher = IdentityHasher(b"evidence-integration-secret")
    keyring.attach(store.keys, hasher, used_by="test")
    store.operator.erase(
        "tenant-2", tenant_hash=hasher.tenant("tenant-2"), actor="dpo", reason="request-1"
    )

    left = db.execute("SELECT DISTINCT tenant_id FROM delivery_copy ORDER BY 1").fetchall()
    assert left == [(f"tenant-{t}",) for t in range(3, 7)]


def test_a_replay_does_not_wait_for_the_worker_that_holds_its_row(
    store: PostgresStore, db_url: str
) -> None:
    store.inbox.ingest([delivery(1)])
    (claim,) = store.claims.claim("w", 1, timedelta(minutes=5))
    # a worker's write on its row, left open: a claim's or a settlement's update takes this lock
    with psycopg.connect(db_url, autocommit=False) as worker:
        worker.execute("SELECT 1 FROM work_item WHERE operation_id = 'op-1' FOR NO KEY UPDATE")
        worker.execute("SET lock_timeout = 0")
        done = threading.Event()

        def replay() -> None:
            store.inbox.ingest([delivery(1)])
            done.set()

        writer = threading.Thread(target=replay, daemon=True)
        writer.start()
        assert done.wait(30), "the replay waited for the worker's lock on its row"
        worker.rollback()
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    assert store.operator.evidence(Key("tenant-1", "op-1")).replays == 1
