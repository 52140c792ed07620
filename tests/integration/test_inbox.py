"""Inbox decisions: new, replay, conflict, quarantined; tenants never collide."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from bridge.errors import LeaseLost
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import (
    Decision,
    Delivery,
    IngestResult,
    Key,
    Rejection,
    State,
    TargetClass,
    Ticket,
    payload_digest,
)

LEASE = timedelta(seconds=30)


def delivery(tenant: str, op: str, payload: bytes = b'{"amount": 5}', **kw: object) -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="refunds",
        job_type="refund",
        target_class=TargetClass.C,
        payload=payload,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.promise("replay-conflict")
def test_same_payload_twice_is_a_replay(store: PostgresStore) -> None:
    first = store.inbox.ingest([delivery("t1", "op-1")])
    second = store.inbox.ingest([delivery("t1", "op-1")])
    assert [r.decision for r in first] == [Decision.NEW]
    assert [r.decision for r in second] == [Decision.REPLAY]
    assert second[0].state is State.QUEUED


def test_a_new_row_holds_every_field_of_its_delivery_as_delivered(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The batch travels as one JSON text and one bytea array: text outside ASCII, quotes,
    backslashes and absent fields come back as they were, and the body byte for byte."""
    body = bytes(range(256)) + b'"\\'
    given = [
        delivery(
            'tenant-é"q\\',
            "op-\U0001f600-\u65e5\u672c",
            body,
            schema_version='v2 "quoted"',
            max_attempts=7,
            ordering_key="group-ü",
            broker_message_id="m-1",
            receive_count=3,
            trace_context="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            priority=-2,
        ),
        delivery("t2", "op-2", b""),
    ]
    results = store.inbox.ingest(given)
    assert [r.decision for r in results] == [Decision.NEW, Decision.NEW]
    rows = db.execute(
        "SELECT w.tenant_id, w.operation_id, w.subscription, w.job_type, w.target_class,"
        " w.schema_version, w.payload_hash, w.max_attempts, w.ordering_key,"
        " w.broker_message_id, w.receive_count, w.trace_context, w.priority, p.body"
        " FROM work_item w JOIN payload p USING (payload_ref) ORDER BY w.seq"
    ).fetchall()
    assert rows == [
        (
            d.tenant_id,
            d.operation_id,
            d.subscription,
            d.job_type,
            d.target_class.value,
            d.schema_version,
            d.payload_hash,
            d.max_attempts,
            d.ordering_key,
            d.broker_message_id,
            d.receive_count,
            d.trace_context,
            d.priority,
            d.payload,
        )
        for d in given
    ]


@pytest.mark.promise("replay-conflict")
def test_changed_payload_is_a_conflict_that_mutates_nothing(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    store.inbox.ingest([delivery("t1", "op-1", b"one")])
    before = db.execute("SELECT * FROM work_item").fetchall()
    result = store.inbox.ingest([delivery("t1", "op-1", b"two", broker_message_id="m-2")])
    assert [r.decision for r in result] == [Decision.CONFLICT]
    assert db.execute("SELECT * FROM work_item").fetchall() == before
    rejected = db.execute(
        "SELECT kind, tenant_id, operation_id, broker_message_id, payload_ref"
        " FROM rejected_delivery"
    ).fetchall()
    assert rejected == [("conflict", "t1", "op-1", "m-2", None)]


def test_duplicates_inside_one_batch(store: PostgresStore) -> None:
    result = store.inbox.ingest(
        [delivery("t1", "a", b"x"), delivery("t1", "a", b"x"), delivery("t1", "a", b"y")]
    )
    assert [r.decision for r in result] == [Decision.NEW, Decision.REPLAY, Decision.CONFLICT]


def test_two_tenants_with_the_same_operation_id_are_two_operations(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    result = store.inbox.ingest([delivery("t1", "op-1", b"x"), delivery("t2", "op-1", b"y")])
    assert [r.decision for r in result] == [Decision.NEW, Decision.NEW]
    claims = store.claims.claim("w", 10, lease=LEASE)
    assert {c.key for c in claims} == {Key("t1", "op-1"), Key("t2", "op-1")}
    assert {c.key: c.payload for c in claims} == {Key("t1", "op-1"): b"x", Key("t2", "op-1"): b"y"}


@pytest.mark.promise("quarantine")
def test_rejections_are_recorded_with_reason_and_body(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    result = store.inbox.ingest(
        [
            Rejection(
                subscription="refunds",
                reason="missing tenant_id",
                body=b"{}",
                broker_message_id="m-9",
            ),
            delivery("t1", "op-1"),
        ]
    )
    assert [r.decision for r in result] == [Decision.QUARANTINED, Decision.NEW]
    row = db.execute(
        "SELECT r.kind, r.reason, r.broker_message_id, p.body FROM rejected_delivery r "
        "JOIN payload p USING (payload_ref)"
    ).fetchone()
    assert row == ("quarantined", "missing tenant_id", "m-9", b"{}")


def test_replay_reports_the_current_state_and_schedules_nothing(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    store.inbox.ingest([delivery("t1", "op-1")])
    (claim,) = store.claims.claim("w", 1, LEASE)
    assert [r.state for r in store.inbox.ingest([delivery("t1", "op-1")])] == [State.CLAIMED]
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    # the row is not touched: the replays are appended beside it (delivery evidence)
    before = db.execute("SELECT * FROM work_item").fetchall()
    replay = store.inbox.ingest([delivery("t1", "op-1")])
    assert replay == [IngestResult(Decision.REPLAY, Key("t1", "op-1"), State.SUCCEEDED)]
    assert db.execute("SELECT * FROM work_item").fetchall() == before
    assert db.execute("SELECT count(*) FROM delivery_copy").fetchone() == (2,)
    assert store.claims.claim("w", 10, LEASE) == []
    assert db.execute("SELECT count(*) FROM rejected_delivery").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (1,)


def test_conflict_on_a_settled_operation_changes_nothing(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    store.inbox.ingest([delivery("t1", "op-1", b"one")])
    (claim,) = store.claims.claim("w", 1, LEASE)
    store.settle.settle(Settlement(claim.ticket, State.FAILED_TERMINAL, "declined"))
    before = db.execute("SELECT * FROM work_item").fetchall()
    conflict = store.inbox.ingest([delivery("t1", "op-1", b"two")])
    assert conflict == [IngestResult(Decision.CONFLICT, Key("t1", "op-1"), State.FAILED_TERMINAL)]
    assert db.execute("SELECT * FROM work_item").fetchall() == before
    stored = db.execute("SELECT payload_hash FROM rejected_delivery").fetchone()
    assert stored == (payload_digest(b"two"),)  # the evidence is the hash, not the payload


def test_a_replay_after_a_conflict_is_still_a_replay(store: PostgresStore) -> None:
    store.inbox.ingest([delivery("t1", "op-1", b"one")])
    assert store.inbox.ingest([delivery("t1", "op-1", b"two")])[0].decision is Decision.CONFLICT
    assert store.inbox.ingest([delivery("t1", "op-1", b"one")])[0].decision is Decision.REPLAY


@pytest.mark.promise("colliding-tenants")
def test_tenants_with_colliding_operation_ids_never_touch_each_other(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    def rows() -> dict[str, tuple[object, ...]]:
        found = db.execute(
            "SELECT tenant_id, state, fence, attempts, outcome_code, payload_hash"
            " FROM work_item WHERE operation_id = 'op-1'"
        ).fetchall()
        return {str(r[0]): r[1:] for r in found}

    store.inbox.ingest([delivery("t1", "op-1", b"x"), delivery("t2", "op-1", b"y")])
    t2_queued = rows()["t2"]

    # A claim of one tenant's key leaves the other's row queued.
    (c1,) = store.claims.claim_keys("w1", [Key("t1", "op-1")], LEASE)
    assert rows()["t2"] == t2_queued
    # Same operation id, same fence number, other tenant: the ticket does not fit.
    with pytest.raises(LeaseLost):
        store.settle.settle(Settlement(Ticket("t2", "op-1", c1.fence), State.SUCCEEDED, "ok"))
    assert rows()["t2"] == t2_queued

    (c2,) = store.claims.claim_keys("w2", [Key("t2", "op-1")], LEASE)
    assert c2.fence == c1.fence == 1
    store.settle.settle(Settlement(c1.ticket, State.SUCCEEDED, "ok"))
    assert rows()["t1"][0] == "succeeded"
    t2_claimed = rows()["t2"]
    assert t2_claimed[:3] == ("claimed", 1, 1)

    # One tenant's conflict is recorded against that tenant only; the other's payload is the
    # conflicting one here, so the same bytes are a replay for t2.
    result = store.inbox.ingest([delivery("t1", "op-1", b"y"), delivery("t2", "op-1", b"y")])
    assert [r.decision for r in result] == [Decision.CONFLICT, Decision.REPLAY]
    assert [r.state for r in result] == [State.SUCCEEDED, State.CLAIMED]
    assert rows()["t2"] == t2_claimed
    rejected = db.execute("SELECT tenant_id, operation_id FROM rejected_delivery").fetchall()
    assert rejected == [("t1", "op-1")]

    store.settle.settle(Settlement(c2.ticket, State.UNKNOWN, "timeout"))
    assert rows()["t1"][0] == "succeeded"
    assert rows()["t2"][0] == "unknown"


def test_concurrent_batches_with_the_same_keys_create_each_operation_once(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    batch = [delivery(f"t{i % 2}", f"op-{i}") for i in range(40)]
    barrier = threading.Barrier(4)
    results: list[list[IngestResult]] = []

    def ingest(order: list[Delivery]) -> None:
        barrier.wait()
        results.append(store.inbox.ingest(order))

    threads = [threading.Thread(target=ingest, args=(batch[::step],)) for step in (1, -1, 1, -1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    news = [r.key for rs in results for r in rs if r.decision is Decision.NEW]
    replays = [r.key for rs in results for r in rs if r.decision is Decision.REPLAY]
    assert len(results) == 4
    assert sorted(news, key=repr) == sorted((d.key for d in batch), key=repr)
    assert len(replays) == 3 * len(batch)
    assert db.execute("SELECT count(*), count(DISTINCT seq) FROM work_item").fetchone() == (40, 40)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (40,)
