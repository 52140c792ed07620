"""Brokers redeliver: a batch that holds copies of earlier deliveries (the same payload: a
replay; another payload: a conflict), of keys the database holds or that the batch itself holds,
is decided as the careful write decides it, recorded as it records it, and written in one round
trip. Only a key that cannot be decided in the statement's snapshot (inserted by a writer that
commits while the statement waits on it) sends the batch the careful way."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.store import PostgresStore
from bridge.store.ingest import CONFLICT_REASON
from bridge.types import Decision, Delivery, IngestResult, InsertClaim, Key, State
from tests.support.deliveries import delivery
from tests.support.frontend import frontend_messages
from tests.support.waiting import eventually

Db = psycopg.Connection[tuple[Any, ...]]
BATCH = 10


@pytest.fixture
def single(db_url: str) -> Any:
    """A store on a pool of one connection: every call goes through the traced one."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1)
    yield store
    store.close()


def redelivered(operations: int, seed: int) -> list[Delivery]:
    """``operations`` new deliveries with copies among them, as a broker redelivers: about one
    delivery in ten a copy of an earlier one with the same payload, one in thirty with a
    changed one; some copies land in the batch that holds their first."""
    rng = random.Random(seed)
    stream: list[Delivery] = []
    fresh = 0
    while fresh < operations:
        roll = rng.random()
        if stream and roll < 0.13:
            # mostly an earlier batch's delivery; now and then one of this batch
            start = len(stream) - len(stream) % BATCH
            pick = rng.randrange(start if start and rng.random() < 0.8 else len(stream))
            earlier = stream[pick]
            payload = earlier.payload if roll < 0.1 else b'{"changed": %d}' % len(stream)
            stream.append(delivery(earlier.operation_id, tenant=earlier.tenant_id, payload=payload))
        else:
            stream.append(delivery(f"op-{fresh}", tenant=f"t{fresh % 4}"))
            fresh += 1
    return stream


def expected(stream: list[Delivery]) -> list[Decision]:
    """Each delivery's decision: its key's first new, a later one with the first's payload a
    replay, with another a conflict."""
    first: dict[Key, bytes] = {}
    decisions = []
    for d in stream:
        if d.key not in first:
            first[d.key] = d.payload_hash
            decisions.append(Decision.NEW)
        elif d.payload_hash == first[d.key]:
            decisions.append(Decision.REPLAY)
        else:
            decisions.append(Decision.CONFLICT)
    return decisions


def test_redeliveries_at_volume_are_decided_right_and_each_batch_is_one_round_trip(
    single: PostgresStore, db: Db
) -> None:
    stream = redelivered(1100, seed=43)
    decisions = expected(stream)
    batches = [stream[i : i + BATCH] for i in range(0, len(stream), BATCH)]
    assert len(stream) >= 1200
    holding = [
        i for i in range(0, len(stream), BATCH) if set(decisions[i : i + BATCH]) != {Decision.NEW}
    ]
    assert len(holding) > len(batches) / 2, "most batches hold a copy"
    results: list[IngestResult] = []

    def write() -> None:
        for batch in batches:
            results.extend(single.inbox.ingest(batch))

    sent = frontend_messages(single, write)
    assert [(r.decision, r.key) for r in results] == [
        (decision, d.key) for decision, d in zip(decisions, stream, strict=True)
    ]
    assert all(r.state is State.QUEUED for r in results)
    # One statement per batch, each closed by its one Sync: no BEGIN, no COMMIT, no refusal
    # followed by the careful way (psycopg prepares the statement once, at its fifth use, with
    # a Sync of its own).
    assert sent["Execute"] == len(batches), sent
    assert sent["Sync"] <= len(batches) + 1, sent
    assert sent["Query"] == 0, sent

    counts = Counter(decisions)
    assert counts[Decision.REPLAY] > 80
    assert counts[Decision.CONFLICT] > 20
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (counts[Decision.NEW],)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (counts[Decision.NEW],)
    replays = Counter(d.key for d, x in zip(stream, decisions, strict=True) if x is Decision.REPLAY)
    copies = db.execute(
        "SELECT tenant_id, operation_id, count(*) FROM delivery_copy GROUP BY 1, 2"
    ).fetchall()
    assert {Key(t, o): n for t, o, n in copies} == replays
    conflicts = Counter(
        (d.key, d.payload_hash)
        for d, x in zip(stream, decisions, strict=True)
        if x is Decision.CONFLICT
    )
    rejected = db.execute(
        "SELECT tenant_id, operation_id, payload_hash, kind, reason, subscription, job_type,"
        " payload_ref FROM rejected_delivery"
    ).fetchall()
    assert Counter((Key(t, o), bytes(h)) for t, o, h, *_ in rejected) == conflicts
    assert {tuple(r[3:]) for r in rejected} == {
        ("conflict", CONFLICT_REASON, "refunds", "refund", None)
    }


def test_a_copy_of_a_row_written_claimed_in_the_same_batch_is_a_replay_of_the_claimed_row(
    single: PostgresStore, db: Db
) -> None:
    single.inbox.ingest([delivery("old")])
    claim = InsertClaim("w1", {"refund": timedelta(seconds=30)}, limit=1)
    batch = [
        delivery("new"),
        delivery("old"),
        delivery("new"),
        delivery("new", payload=b"changed"),
    ]
    results: list[IngestResult] = []
    sent = frontend_messages(single, lambda: results.extend(single.inbox.ingest(batch, claim)))
    assert [(r.decision, r.state) for r in results] == [
        (Decision.NEW, State.CLAIMED),
        (Decision.REPLAY, State.QUEUED),
        (Decision.REPLAY, State.CLAIMED),
        (Decision.CONFLICT, State.CLAIMED),
    ]
    assert results[0].claim is not None
    assert results[0].claim.fence >= 1
    assert sent["Sync"] == 1, sent
    assert sent["Query"] == 0, sent
    evidence = single.operator.evidence(Key("t1", "new"))
    assert (evidence.replays, evidence.conflicts) == (1, 1)
    assert single.operator.evidence(Key("t1", "old")).replays == 1


def waiting_on_a_transaction(db: Db) -> bool:
    found = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event = 'transactionid'"
    ).fetchone()
    return bool(found and found[0])


def test_a_key_committed_while_the_statement_waits_on_it_is_decided_the_careful_way(
    db_url: str, db: Db
) -> None:
    """Another writer inserted the key and commits after the statement began: the insert waits
    for it and leaves the key as it is, and the statement's snapshot does not see the row. The
    statement refuses, commits nothing, and the careful way reads the row: a replay."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=2)
    other = psycopg.connect(db_url)
    try:
        raced = delivery("raced")
        other.execute(
            "INSERT INTO work_item (tenant_id, operation_id, subscription, job_type,"
            " target_class, payload_hash, payload_ref)"
            " VALUES ('t1', 'raced', 'refunds', 'refund', 'A', %s, 'pg:raced')",
            (raced.payload_hash,),
        )
        results: list[IngestResult] = []
        writer = threading.Thread(
            target=lambda: results.extend(store.inbox.ingest([delivery("fresh"), raced]))
        )
        writer.start()
        eventually(lambda: waiting_on_a_transaction(db), "the insert waits on the other writer")
        other.commit()
        writer.join(30)
    finally:
        other.close()
        store.close()
    assert [r.decision for r in results] == [Decision.NEW, Decision.REPLAY]
    assert db.execute("SELECT count(*) FROM delivery_copy").fetchone() == (1,)
    rows = db.execute("SELECT operation_id FROM work_item ORDER BY 1").fetchall()
    assert rows == [("fresh",), ("raced",)]
