"""The tenant backlog quota on PostgreSQL: a tenant at its quota gets nothing new written, its
replays and conflicts are decided as always, the other tenants of the batch flow, and a
deferred delivery is written once it comes back below the quota."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import timedelta

import psycopg
import pytest

from bridge.ingest.inbox import Deferred, Inbox, Written
from bridge.store import PostgresStore
from bridge.store.work import QuotaDeferred, Settlement
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    RawDelivery,
    Rejection,
    State,
    TargetClass,
)

LEASE = timedelta(seconds=30)
Db = psycopg.Connection[tuple[object, ...]]


def delivery(
    tenant: str, op: str, payload: bytes = b'{"amount": 5}', subscription: str = "refunds"
) -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription=subscription,
        job_type="refund",
        target_class=TargetClass.C,
        payload=payload,
    )


def rows(db: Db, tenant: str) -> set[str]:
    found = db.execute("SELECT operation_id FROM work_item WHERE tenant_id = %s", (tenant,))
    return {str(op) for (op,) in found.fetchall()}


def decisions(results: Sequence[IngestResult | QuotaDeferred]) -> list[str]:
    return [r.decision.value if isinstance(r, IngestResult) else "deferred" for r in results]


def test_a_tenant_at_its_quota_is_deferred_while_the_other_tenant_flows(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("flood", f"old-{i}") for i in range(3)])
    batch: list[Delivery | Rejection] = [
        delivery("flood", "new-1"),
        delivery("quiet", "q-1"),
        delivery("flood", "old-0"),  # a replay: acked, adds no row
        delivery("flood", "new-2"),
        delivery("flood", "old-1", b"changed"),  # a conflict: recorded, adds no row
        delivery("quiet", "q-2"),
        delivery("flood", "new-1"),  # the same new operation again: deferred with it
        Rejection(subscription="refunds", reason="not_json", body=b"{", tenant_id="flood"),
    ]

    results = store.inbox.ingest_within_quota(batch, quota=3)

    assert decisions(results) == [
        "deferred",
        "new",
        "replay",
        "deferred",
        "conflict",
        "new",
        "deferred",
        "quarantined",
    ]
    deferred = [r for r in results if isinstance(r, QuotaDeferred)]
    assert [d.key.operation_id for d in deferred] == ["new-1", "new-2", "new-1"]
    assert {d.backlog for d in deferred} == {3}
    assert rows(db, "flood") == {"old-0", "old-1", "old-2"}
    assert rows(db, "quiet") == {"q-1", "q-2"}
    assert db.execute(
        "SELECT kind, operation_id FROM rejected_delivery ORDER BY id"
    ).fetchall() == [("conflict", "old-1"), ("quarantined", None)]
    assert db.execute(
        "SELECT count(*) FROM payload p JOIN work_item w USING (payload_ref)"
        " WHERE w.tenant_id = 'flood'"
    ).fetchone() == (3,)


def test_a_tenant_below_its_quota_takes_what_is_left_in_delivery_order(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("t1", "old")])
    results = store.inbox.ingest_within_quota(
        [delivery("t1", f"op-{i}") for i in range(5)], quota=3
    )
    assert decisions(results) == ["new", "new", "deferred", "deferred", "deferred"]
    assert rows(db, "t1") == {"old", "op-0", "op-1"}


def test_the_backlog_is_queued_and_claimed_rows_of_every_subscription(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("t1", "other", subscription="sms"), delivery("t1", "a")])
    claimed = store.claims.claim("w", 1, lease=LEASE)
    assert len(claimed) == 1
    # one claimed, one queued, from two subscriptions: at a quota of 2
    assert decisions(store.inbox.ingest_within_quota([delivery("t1", "b")], quota=2)) == [
        "deferred"
    ]
    store.settle.settle(Settlement(claimed[0].ticket, State.SUCCEEDED, "ok"))
    # one settled: terminal rows do not count, so the deferred delivery is written on its return
    assert decisions(store.inbox.ingest_within_quota([delivery("t1", "b")], quota=2)) == ["new"]
    assert rows(db, "t1") == {"other", "a", "b"}


def test_a_deferred_delivery_is_written_when_it_comes_back_below_the_quota(
    store: PostgresStore, db: Db
) -> None:
    flood = [delivery("flood", f"op-{i}") for i in range(6)]
    first = store.inbox.ingest_within_quota(flood, quota=2)
    assert decisions(first) == ["new", "new"] + ["deferred"] * 4
    settled = 0
    for _ in range(10):
        for claim in store.claims.claim("w", 10, lease=LEASE):
            store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
            settled += 1
        again = store.inbox.ingest_within_quota(flood, quota=2)
        if all(isinstance(r, IngestResult) for r in again):
            break
    assert decisions(again).count("deferred") == 0
    # every operation written once: now a replay each, never a second row
    assert decisions(store.inbox.ingest_within_quota(flood, quota=2)) == ["replay"] * 6
    assert rows(db, "flood") == {f"op-{i}" for i in range(6)}
    assert settled >= 4


def test_a_quota_below_one_is_refused(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        store.inbox.ingest_within_quota([delivery("t1", "a")], quota=0)


def test_concurrent_writers_pass_the_quota_by_at_most_one_batch_each(
    store: PostgresStore, db: Db
) -> None:
    writers, batches, size, quota = 4, 5, 10, 20
    barrier = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(w: int) -> None:
        try:
            barrier.wait()
            for b in range(batches):
                store.inbox.ingest_within_quota(
                    [delivery("flood", f"w{w}-b{b}-{i}") for i in range(size)], quota=quota
                )
        except BaseException as exc:  # noqa: BLE001  (reported below)
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    (written,) = db.execute("SELECT count(*) FROM work_item").fetchone() or (0,)
    assert isinstance(written, int)
    assert quota <= written <= quota + (writers - 1) * size


def raw(tenant: str, op: str) -> RawDelivery:
    return RawDelivery(
        subscription="refunds", message_id=f"m-{tenant}-{op}", body=op.encode(), attributes={}
    )


def test_the_inbox_returns_deferred_deliveries_and_hands_off_only_new_ones(
    store: PostgresStore, db: Db
) -> None:
    def decoder(r: RawDelivery) -> Delivery:
        tenant = (r.message_id or "").split("-")[1]
        return delivery(tenant, r.body.decode())

    handed: list[Key] = []

    class Handed:
        """A pool with no free slot: every new key is handed off."""

        def reserve(self, job_types: Iterable[str]) -> InsertClaim | None:
            return None

        def accept(self, reserved: InsertClaim, claims: Sequence[Claim], sent_at: float) -> None:
            raise AssertionError("nothing was reserved")

        def hand_off(self, items: Iterable[tuple[Key, str]]) -> None:
            handed.extend(k for k, _ in items)

    inbox = Inbox(store.inbox, decoder, pool=Handed())
    inbox.write([raw("flood", "a")])
    handed.clear()

    outcomes = inbox.admit([raw("flood", "b"), raw("quiet", "c"), raw("flood", "a")], quota=1)

    assert [type(o) for o in outcomes] == [Deferred, Written, Written]
    first = outcomes[0]
    assert isinstance(first, Deferred)
    assert first.reason == "quota"
    assert first.decoded.key == Key("flood", "b")
    assert [o.decision for o in outcomes if isinstance(o, Written)] == [
        Decision.NEW,
        Decision.REPLAY,
    ]
    assert handed == [Key("quiet", "c")]
    assert rows(db, "flood") == {"a"}
    # without a quota the inbox writes everything, as before
    assert [o.decision for o in inbox.write([raw("flood", "b")])] == [Decision.NEW]
