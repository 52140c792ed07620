"""Inbox decisions: new, replay, conflict, quarantined; tenants never collide."""

from __future__ import annotations

import psycopg

from bridge.store import PostgresStore
from bridge.types import Decision, Delivery, Key, Rejection, State, TargetClass


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


def test_same_payload_twice_is_a_replay(store: PostgresStore) -> None:
    first = store.ingest([delivery("t1", "op-1")])
    second = store.ingest([delivery("t1", "op-1")])
    assert [r.decision for r in first] == [Decision.NEW]
    assert [r.decision for r in second] == [Decision.REPLAY]
    assert second[0].state is State.QUEUED


def test_changed_payload_is_a_conflict_that_mutates_nothing(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    store.ingest([delivery("t1", "op-1", b"one")])
    before = db.execute("SELECT * FROM work_item").fetchall()
    result = store.ingest([delivery("t1", "op-1", b"two", broker_message_id="m-2")])
    assert [r.decision for r in result] == [Decision.CONFLICT]
    assert db.execute("SELECT * FROM work_item").fetchall() == before
    rejected = db.execute(
        "SELECT kind, tenant_id, operation_id, broker_message_id, payload_ref"
        " FROM rejected_delivery"
    ).fetchall()
    assert rejected == [("conflict", "t1", "op-1", "m-2", None)]


def test_duplicates_inside_one_batch(store: PostgresStore) -> None:
    result = store.ingest(
        [delivery("t1", "a", b"x"), delivery("t1", "a", b"x"), delivery("t1", "a", b"y")]
    )
    assert [r.decision for r in result] == [Decision.NEW, Decision.REPLAY, Decision.CONFLICT]


def test_two_tenants_with_the_same_operation_id_are_two_operations(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    result = store.ingest([delivery("t1", "op-1", b"x"), delivery("t2", "op-1", b"y")])
    assert [r.decision for r in result] == [Decision.NEW, Decision.NEW]
    claims = store.claim("w", 10, lease=__import__("datetime").timedelta(seconds=30))
    assert {c.key for c in claims} == {Key("t1", "op-1"), Key("t2", "op-1")}
    assert {c.key: c.payload for c in claims} == {Key("t1", "op-1"): b"x", Key("t2", "op-1"): b"y"}


def test_rejections_are_recorded_with_reason_and_body(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    result = store.ingest(
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
