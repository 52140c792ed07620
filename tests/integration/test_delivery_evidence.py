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
from typing import Any

import psycopg

from bridge.store import PostgresStore
from bridge.types import Delivery, Key, TargetClass

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
            "SELECT w.tenant_id, w.operation_id, w.replays,"
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
    assert db.execute("SELECT sum(replays), count(*) FROM work_item").fetchone() == (0, 2)

    store.inbox.ingest(batch)  # the broker delivers the batch again

    assert db.execute(
        "SELECT operation_id, replays FROM work_item ORDER BY operation_id"
    ).fetchall() == [("op-1", 1), ("op-2", 1), ("op-3", 0)]
