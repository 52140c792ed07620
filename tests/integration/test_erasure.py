"""Erasure that keeps dedupe, on PostgreSQL: an erased operation leaves a tombstone (keyed
hashes, payload hash, state), and a redelivery of it is a replay or a conflict, never new work.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.errors import ConfigError, ErasureRefused, StoreUnavailable
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.store import PostgresStore
from bridge.store.records import ErasureCounts
from bridge.store.work import Settlement
from bridge.types import Decision, Delivery, IngestResult, Key, RawDelivery, Rejection, State
from tests.support.clock import Clock
from tests.support.deliveries import delivery

Db = psycopg.Connection[tuple[Any, ...]]

HASHER = IdentityHasher(b"erasure-test-identity-key-0123456789")
LEASE = timedelta(seconds=30)


@pytest.fixture
def keyed(store: PostgresStore) -> PostgresStore:
    keyring.attach(store.keys, HASHER, used_by="test")
    return store


def settle_all(store: PostgresStore, state: State = State.SUCCEEDED) -> int:
    """Claim every claimable row and settle it; how many were settled."""
    done = 0
    while claims := store.claims.claim("w1", 200, LEASE):
        if state is State.SUCCEEDED:
            store.settle.settle_many(
                [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in claims]]
            )
        else:
            for c in claims:
                store.settle.settle(Settlement(c.ticket, State.UNKNOWN, "lost"))
        done += len(claims)
    return done


def erase(
    store: PostgresStore, tenant: str, operation: str | None = None, *, dry_run: bool = False
) -> ErasureCounts:
    return store.operator.erase(
        tenant,
        operation_id=operation,
        tenant_hash=HASHER.tenant(tenant),
        operation_hash=None if operation is None else HASHER.operation(tenant, operation),
        actor="dpo",
        reason="request-17",
        dry_run=dry_run,
    )


def traced(op: str, tenant: str = "t1", payload: bytes | None = None) -> Delivery:
    return dataclasses.replace(
        delivery(op, tenant=tenant, payload=payload),
        trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        broker_message_id=f"m-{tenant}-{op}",
    )


def everything_of(db: Db) -> str:
    """Every row of every fencebridge table, as text: where a raw identifier could remain."""
    tables = [
        r[0]
        for r in db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    ]
    return "\n".join(
        str(row)
        for t in tables
        for row in db.execute(f"SELECT to_jsonb(x)::text FROM {t} x").fetchall()
    )


# -- erasing -----------------------------------------------------------------------------------


def test_erasing_a_tenant_keeps_one_tombstone_per_operation_and_no_identifier_or_payload(
    keyed: PostgresStore, db: Db
) -> None:
    tenant, other = "acme-customer-4711", "globex"
    keyed.inbox.ingest(
        [traced(f"order-{i}", tenant) for i in range(5)] + [delivery("order-0", tenant=other)]
    )
    settle_all(keyed)
    # a conflict and an undecodable delivery of the tenant, with a body
    keyed.inbox.ingest(
        [
            traced("order-1", tenant, payload=b'{"amount": 2}'),
            Rejection(
                subscription="refunds",
                reason="bad json",
                body=b"secret body of acme-customer-4711",
                tenant_id=tenant,
                operation_id="order-9",
            ),
        ]
    )

    counts = erase(keyed, tenant)

    assert counts == ErasureCounts(
        work_rows=5,
        payloads=6,
        rejected_deliveries=2,
        redrive_audits=0,
        tombstones=5,
        tombstone_keys=(1,),
    )
    left = everything_of(db)
    assert tenant not in left
    assert "order-1" not in left
    assert "secret body" not in left
    assert "0af7651916cd43dd8448eb211c80319c" not in left  # the erased rows' trace context
    tombstones = db.execute(
        "SELECT key_id, tenant_hash, state, outcome_code, payload_hash FROM erased_operation"
    ).fetchall()
    assert sorted(tombstones) == sorted(
        (1, HASHER.tenant(tenant), "succeeded", "ok", traced(f"order-{i}").payload_hash)
        for i in range(5)
    )
    assert db.execute("SELECT tenant_id, operation_id FROM work_item").fetchall() == [
        (other, "order-0")
    ]
    assert db.execute(
        "SELECT tenant_hash, operation_hash, work_rows, tombstones FROM erasure_audit"
    ).fetchall() == [(HASHER.tenant(tenant), None, 5, 5)]


def test_a_redelivery_of_an_erased_operation_is_a_replay_never_new_work(
    keyed: PostgresStore, db: Db
) -> None:
    keyed.inbox.ingest([traced("a"), traced("b")])
    settle_all(keyed)
    erase(keyed, "t1")

    results = keyed.inbox.ingest([traced("a"), traced("a"), traced("b")])

    assert results == [
        IngestResult(Decision.REPLAY, Key("t1", "a"), State.SUCCEEDED, erased=True),
        IngestResult(Decision.REPLAY, Key("t1", "a"), State.SUCCEEDED, erased=True),
        IngestResult(Decision.REPLAY, Key("t1", "b"), State.SUCCEEDED, erased=True),
    ]
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (0,)
    assert keyed.claims.claim("w1", 10, LEASE) == []


def test_a_changed_payload_of_an_erased_operation_is_a_conflict_recorded_by_hashes_only(
    keyed: PostgresStore, db: Db
) -> None:
    keyed.inbox.ingest([traced("a")])
    settle_all(keyed, State.UNKNOWN)
    erase(keyed, "t1")

    changed = traced("a", payload=b'{"amount": 999}')
    results = keyed.inbox.ingest([changed, traced("a")])

    assert [(r.decision, r.state, r.erased) for r in results] == [
        (Decision.CONFLICT, State.UNKNOWN, True),
        (Decision.REPLAY, State.UNKNOWN, True),
    ]
    rejected = db.execute(
        "SELECT kind, tenant_id, operation_id, payload_hash, payload_ref, reason "
        "FROM rejected_delivery"
    ).fetchall()
    assert len(rejected) == 1
    kind, tenant_id, operation_id, payload_hash, payload_ref, reason = rejected[0]
    assert (kind, tenant_id, operation_id, payload_ref) == ("conflict", None, None, None)
    assert bytes(payload_hash) == changed.payload_hash
    assert HASHER.tenant("t1") in reason
    assert "erased operation" in reason
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)


def test_an_after_outcome_consumer_acks_an_erased_replay_at_once(keyed: PostgresStore) -> None:
    """A replay of an existing row is held until the row settles; an erased one has no row to
    wait for, so it must not be held (it would be let go and redelivered forever)."""
    raw = RawDelivery(subscription="refunds", message_id="m-1", body=b"{}", attributes={})
    keyed.inbox.ingest([traced("a")])
    (live,) = Inbox(keyed.inbox, lambda r: traced("a")).write([raw])
    assert (live.decision, live.awaits_outcome) == (Decision.REPLAY, True)
    settle_all(keyed)
    erase(keyed, "t1")
    (gone,) = Inbox(keyed.inbox, lambda r: traced("a")).write([raw])
    assert (gone.decision, gone.awaits_outcome) == (Decision.REPLAY, False)


def test_a_new_operation_of_an_erased_tenant_is_new_work(keyed: PostgresStore) -> None:
    keyed.inbox.ingest([traced("a")])
    settle_all(keyed)
    erase(keyed, "t1")
    (result,) = keyed.inbox.ingest([traced("b")])
    assert (result.decision, result.erased) == (Decision.NEW, False)
    (claim,) = keyed.claims.claim("w1", 10, LEASE)
    assert claim.key == Key("t1", "b")


def test_erasure_is_refused_while_an_operation_in_scope_is_queued_or_claimed(
    keyed: PostgresStore, db: Db
) -> None:
    keyed.inbox.ingest([traced("a"), traced("b")])
    with pytest.raises(ErasureRefused, match=r"2 operation\(s\) in scope are queued or claimed"):
        erase(keyed, "t1")
    keyed.claims.claim("w1", 1, LEASE)
    with pytest.raises(ErasureRefused, match="settled or been parked; nothing was erased"):
        erase(keyed, "t1")
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (2,)
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM erasure_audit").fetchone() == (0,)


def test_erasing_one_operation_leaves_the_tenants_other_operations(
    keyed: PostgresStore, db: Db
) -> None:
    keyed.inbox.ingest([traced("a"), traced("b")])
    settle_all(keyed)
    keyed.inbox.ingest([traced("c")])  # queued: out of scope, so it does not refuse

    counts = erase(keyed, "t1", "a")

    assert (counts.work_rows, counts.payloads, counts.tombstones) == (1, 1, 1)
    assert sorted(db.execute("SELECT operation_id FROM work_item").fetchall()) == [("b",), ("c",)]
    assert db.execute("SELECT operation_hash FROM erasure_audit").fetchall() == [
        (HASHER.operation("t1", "a"),)
    ]
    results = keyed.inbox.ingest([traced("a"), traced("b")])
    assert [(r.decision, r.erased) for r in results] == [
        (Decision.REPLAY, True),
        (Decision.REPLAY, False),
    ]


def test_a_dry_run_counts_and_erases_nothing(keyed: PostgresStore, db: Db) -> None:
    keyed.inbox.ingest([traced("a")])
    settle_all(keyed)
    counts = erase(keyed, "t1", dry_run=True)
    assert (counts.work_rows, counts.tombstones) == (1, 1)
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (0,)


def test_a_store_without_identity_keys_writes_no_new_work_while_tombstones_exist(
    keyed: PostgresStore, db_url: str
) -> None:
    keyed.inbox.ingest([traced("a")])
    settle_all(keyed)
    unkeyed = PostgresStore.connect(db_url, max_size=1)
    try:
        with pytest.raises(ConfigError, match="erase"):
            unkeyed.operator.erase("t1", tenant_hash="t_x", actor="dpo", reason="r")
        unkeyed.inbox.ingest([traced("b")])  # no tombstone yet: it cannot match any
        erase(keyed, "t1", "a")
        with pytest.raises(ConfigError, match="identity keys to recognise them"):
            unkeyed.inbox.ingest([traced("a")])
    finally:
        unkeyed.close()


def test_a_tombstone_written_before_a_key_rotation_is_still_found(
    keyed: PostgresStore, db_url: str
) -> None:
    keyed.inbox.ingest([traced("a")])
    settle_all(keyed)
    erase(keyed, "t1")
    new = IdentityHasher(
        b"erasure-test-identity-key-rotated!!", [b"erasure-test-identity-key-0123456789"]
    )
    rotated = PostgresStore.connect(db_url, max_size=2)
    try:
        keyring.rotate(rotated.keys, new, actor="ops", reason="yearly")
        keyring.attach(rotated.keys, new, used_by="test")
        (result,) = rotated.inbox.ingest([traced("a")])
        assert (result.decision, result.erased) == (Decision.REPLAY, True)

        # a process without the key the tombstones were written under is refused at start
        alone = IdentityHasher(b"erasure-test-identity-key-rotated!!")
        with pytest.raises(keyring.IdentityKeyMismatch, match="1 erased operation"):
            keyring.attach(rotated.keys, alone, used_by="test")
    finally:
        rotated.close()


def test_tombstones_are_purged_only_past_the_horizon(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clock.at = datetime.now(UTC)  # erased_at is the database's now(): the clock starts there
    keyring.attach(clocked.keys, HASHER, used_by="test")
    clocked.inbox.ingest([traced("a"), traced("b")])
    settle_all(clocked)
    erase(clocked, "t1")
    clock.advance(timedelta(days=34))
    horizon = timedelta(days=35)
    assert (
        clocked.operator.purge_preview(timedelta(days=30), tombstone_horizon=horizon).tombstones
        == 0
    )
    counts = clocked.operator.purge_batch(timedelta(days=30), 100, tombstone_horizon=horizon)
    assert counts is not None
    assert counts.tombstones == 0
    (result,) = clocked.inbox.ingest([traced("a")])
    assert (result.decision, result.erased) == (Decision.REPLAY, True)

    clock.advance(timedelta(days=2))
    assert (
        clocked.operator.purge_preview(timedelta(days=30), tombstone_horizon=horizon).tombstones
        == 2
    )
    counts = clocked.operator.purge_batch(timedelta(days=30), 1, tombstone_horizon=horizon)
    assert counts is not None
    assert counts.tombstones == 1
    counts = clocked.operator.purge_batch(timedelta(days=30), 100, tombstone_horizon=horizon)
    assert counts is not None
    assert counts.tombstones == 1
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (0,)


# -- a backlog ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_backlog_of_erased_and_kept_tenants_redelivered_with_duplicates_and_changes(
    keyed: PostgresStore, db: Db
) -> None:
    """1,200 operations of four tenants (colliding operation ids), two erased; every one
    redelivered twice in shuffled batches, 60 with a changed payload, while the second erasure
    runs beside the redeliveries: no erased operation ever becomes new work."""
    tenants = ["erased-1", "erased-2", "kept-1", "kept-2"]
    ops = [f"op-{i}" for i in range(300)]
    keyed.inbox.ingest([traced(o, t) for t in tenants for o in ops[:150]])
    keyed.inbox.ingest([traced(o, t) for t in tenants for o in ops[150:]])
    assert settle_all(keyed) == 1200
    erase(keyed, "erased-1")

    rng = random.Random(17)
    changed = {(t, o) for t in tenants for o in rng.sample(ops, 15)}
    redelivered = [
        traced(o, t, payload=b'{"changed": true}' if (t, o) in changed and copy else None)
        for t in tenants
        for o in ops
        for copy in (0, 1)
    ]
    rng.shuffle(redelivered)
    batches = [redelivered[i : i + 10] for i in range(0, len(redelivered), 10)]

    seen: list[tuple[Delivery, IngestResult]] = []
    retried = Counter[str]()
    failures: list[BaseException] = []

    def redeliver() -> None:
        try:
            for batch in batches:
                while True:
                    try:
                        seen.extend(zip(batch, keyed.inbox.ingest(batch), strict=True))
                        break
                    except StoreUnavailable:
                        retried["vanished"] += 1  # not acked: the broker hands it over again
        except BaseException as exc:  # noqa: BLE001  (reported below, never lost)
            failures.append(exc)

    thread = threading.Thread(target=redeliver)
    thread.start()
    erase(keyed, "erased-2")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert failures == []

    assert len(seen) == 2400
    assert [d for d, r in seen if r.decision is Decision.NEW] == []
    by_kind = Counter(
        (d.tenant_id.split("-")[0], r.decision, d.payload == b'{"changed": true}') for d, r in seen
    )
    # each kind: 2 tenants x 300 operations x 2 copies, 15 copies changed per tenant
    assert by_kind == {
        ("kept", Decision.CONFLICT, True): 30,
        ("kept", Decision.REPLAY, False): 1170,
        ("erased", Decision.CONFLICT, True): 30,
        ("erased", Decision.REPLAY, False): 1170,
    }
    assert all(r.erased for d, r in seen if d.tenant_id == "erased-1")
    # the second erasure ran beside the redeliveries: before it, copies were replays of the row
    assert db.execute(
        "SELECT tenant_id, count(*) FROM work_item GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("kept-1", 300), ("kept-2", 300)]
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (600,)
    conflicts = db.execute(
        "SELECT count(*) FILTER (WHERE tenant_id IS NULL), count(*) FROM rejected_delivery"
    ).fetchone()
    assert conflicts is not None
    erased_conflicts_recorded, all_conflicts = conflicts
    # kept tenants' conflicts keep their identifiers; erased ones are recorded by hashes (an
    # erased-2 conflict recorded before its erasure was erased with it)
    assert all_conflicts - erased_conflicts_recorded == 30
    assert 15 <= erased_conflicts_recorded <= 30
    assert keyed.claims.claim("w1", 100, LEASE) == []
