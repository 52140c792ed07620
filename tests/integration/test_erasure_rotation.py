"""Erasure across an identity key rotation, on PostgreSQL: stores holding different keys on one
database, as bridges started before and after ``fencebridge identity rotate`` and erasures run
with either set of keys would. A tombstone must be found by every inbox whatever key each
process holds, or the inbox must refuse to write: never new work for an erased operation.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.errors import ConfigError, ErasureRefused, IdentityKeysOutdated
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Decision, Delivery, IngestResult, Key, State, TargetClass
from tests.integration.test_inbox_new_batches import waiting_on
from tests.support.deliveries import delivery
from tests.support.erasure import erase_operation
from tests.support.waiting import eventually

Db = psycopg.Connection[tuple[Any, ...]]

OLD = b"erasure-rotation-test-key-old-00001"
NEW = b"erasure-rotation-test-key-new-00002"
LEASE = timedelta(seconds=30)
CHANGED = b'{"changed": true}'


def notify(op: str, tenant: str, payload: bytes | None = None) -> Delivery:
    """A class D delivery: at most one call, so a second run would be a second effect."""
    return dataclasses.replace(
        delivery(op, tenant=tenant, payload=payload, job_type="notify"),
        target_class=TargetClass.D,
    )


@pytest.fixture
def stores(db_url: str) -> Iterator[Any]:
    """Stores of separate processes on the test's database, each with its own pool."""
    made: list[PostgresStore] = []

    def make() -> PostgresStore:
        s = PostgresStore.connect(db_url, max_size=2)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def attached(make: Any, hasher: IdentityHasher) -> PostgresStore:
    s: PostgresStore = make()
    keyring.attach(s.keys, hasher, used_by="test")
    return s


def run_all(store: PostgresStore, park: frozenset[Key] | set[Key] = frozenset()) -> int:
    """Claim every row this store may claim and run it as class D does: the intent recorded,
    then succeeded, or parked unknown for the keys in ``park``; how many ran."""
    done = 0
    while claims := store.claims.claim("w", 200, LEASE):
        for c in claims:
            store.settle.record_intent(c.ticket)
            if c.key in park:
                store.settle.settle(Settlement(c.ticket, State.UNKNOWN, "lost"))
            else:
                store.settle.settle(Settlement(c.ticket, State.SUCCEEDED, "ok"))
        done += len(claims)
    return done


def erase_tenant(store: PostgresStore, hasher: IdentityHasher, tenant: str) -> None:
    store.operator.erase(
        tenant,
        tenant_hash=hasher.tenant(tenant),
        actor="dpo",
        reason="DSR-7",
    )


@pytest.mark.slow
def test_erased_tenants_redelivered_to_bridges_holding_old_and_new_keys_are_never_new_work(
    stores: Any, db: Db
) -> None:
    """1,200 class D operations of four tenants (colliding operation ids) written and run by a
    bridge holding the old key; the key rotated; one tenant erased by an operator holding the
    new key and the old one, another by one holding the new key alone. Every operation is then
    redelivered twice in shuffled batches, 60 with a changed payload, to the bridge started
    before the rotation first and, where it will not write, to a bridge started after it.

    No erased operation may be written as new work, nor become claimable again. The old bridge
    finds the tombstones written under its key too; once an erasure left tombstones under none
    of its keys, it refuses to write with a message that says so, and the new bridge takes the
    batches instead."""
    tenants = ["erased-1", "erased-2", "kept-1", "kept-2"]
    ops = [f"op-{i}" for i in range(300)]
    rng = random.Random(38)
    unknown = {Key("erased-1", o) for o in rng.sample(ops, 20)}

    old_bridge = attached(stores, IdentityHasher(OLD))
    for tenant in tenants:
        old_bridge.inbox.ingest([notify(o, tenant) for o in ops])
    assert run_all(old_bridge, unknown) == 1200

    rotator = stores()
    keyring.rotate(rotator.keys, IdentityHasher(NEW, [OLD]), actor="ops", reason="yearly")
    new_bridge = attached(stores, IdentityHasher(NEW, [OLD]))

    both = IdentityHasher(NEW, [OLD])
    erase_tenant(attached(stores, both), both, "erased-1")

    changed = {(t, o) for t in tenants for o in rng.sample(ops, 15)}
    copies = [
        notify(o, t, payload=CHANGED if (t, o) in changed and copy else None)
        for t in tenants
        for o in ops
        for copy in (0, 1)
    ]
    rng.shuffle(copies)
    batches = [copies[i : i + 10] for i in range(0, len(copies), 10)]

    seen: list[tuple[Delivery, IngestResult]] = []
    refusals: list[str] = []

    def redeliver(part: list[list[Delivery]]) -> None:
        """Each batch to the old bridge; a batch it refuses is not acknowledged, and the
        broker hands it to the new bridge."""
        for batch in part:
            try:
                results = old_bridge.inbox.ingest(batch)
            except ConfigError as exc:
                refusals.append(str(exc))
                results = new_bridge.inbox.ingest(batch)
            seen.extend(zip(batch, results, strict=True))

    # The old bridge holds the old key, under which the first erasure left tombstones too.
    redeliver(batches[:120])
    assert [(d.key, r.decision) for d, r in seen if r.decision is Decision.NEW] == []
    assert refusals == []

    first_part = len(seen)

    # The second erasure holds the new key alone (no open row, no tombstone needs the old one).
    new_only = IdentityHasher(NEW)
    erase_tenant(attached(stores, new_only), new_only, "erased-2")
    redeliver(batches[120:])

    assert len(seen) == 2400
    assert [(d.key, r.decision) for d, r in seen if r.decision is Decision.NEW] == []
    by_kind = Counter(
        (d.tenant_id.split("-")[0], r.decision, d.payload == CHANGED) for d, r in seen
    )
    assert by_kind == {
        ("kept", Decision.CONFLICT, True): 30,
        ("kept", Decision.REPLAY, False): 1170,
        ("erased", Decision.CONFLICT, True): 30,
        ("erased", Decision.REPLAY, False): 1170,
    }
    # every copy of an erased tenant's operation after its erasure was decided by its tombstone
    after = [(d, r) for d, r in seen if d.tenant_id == "erased-1"] + [
        (d, r) for d, r in seen[first_part:] if d.tenant_id == "erased-2"
    ]
    assert [d.key for d, r in after if not r.erased] == []
    assert Counter(r.state for d, r in seen if d.tenant_id == "erased-1") == {
        State.SUCCEEDED: 560,
        State.UNKNOWN: 40,
    }
    # The old bridge refused only once the second erasure left it nothing to look up by, and
    # said why and what to do.
    assert refusals
    assert all("restart" in why and "key 2" in why for why in refusals)
    assert db.execute(
        "SELECT tenant_id, count(*) FROM work_item GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("kept-1", 300), ("kept-2", 300)]
    assert old_bridge.claims.claim("w", 100, LEASE) == []
    assert new_bridge.claims.claim("w", 100, LEASE) == []


def test_an_eraser_started_before_a_rotation_is_refused_after_it(stores: Any, db: Db) -> None:
    """An eraser that holds only the key that was current when it started would write its
    tombstones under that key, which a bridge started after the rotation with the new key
    alone never looks up."""
    old = IdentityHasher(OLD)
    before = attached(stores, old)
    before.inbox.ingest([notify("op-1", "t1"), notify("op-2", "t1")])
    run_all(before)
    keyring.rotate(stores().keys, IdentityHasher(NEW, [OLD]), actor="ops", reason="leak")
    after = attached(stores, IdentityHasher(NEW))

    with pytest.raises(ErasureRefused, match="key 2") as refused:
        erase_operation(before, old, "t1", "op-1")
    assert "current" in str(refused.value)
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (2,)

    erase_operation(after, IdentityHasher(NEW), "t1", "op-1")
    (result,) = after.inbox.ingest([notify("op-1", "t1")])
    assert (result.decision, result.erased) == (Decision.REPLAY, True)


def test_an_erasure_waits_for_a_rotation_in_progress_and_is_refused_once_it_commits(
    stores: Any, db_url: str, db: Db
) -> None:
    """A rotation and an erasure at once: had the erasure read the current key before the
    rotation committed, a bridge started with the new key alone (no tombstone visible to its
    check yet) would never find the erasure's tombstones."""
    old = IdentityHasher(OLD)
    eraser = attached(stores, old)
    eraser.inbox.ingest([notify("op-1", "t1")])
    run_all(eraser)

    rotation: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(db_url)
    outcome: list[BaseException | None] = []
    try:
        rotation.execute(
            "INSERT INTO identity_key (key_id, fingerprint, registered_by, reason)"
            " VALUES (2, %s, 'ops', 'rotation in progress')",
            (IdentityHasher(NEW).fingerprint,),
        )

        def run() -> None:
            try:
                erase_operation(eraser, old, "t1", "op-1")
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001  (asserted below)
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()

        def waiting() -> bool:
            row = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%fencebridge_erase%'"
            ).fetchone()
            return row == (1,)

        eventually(lambda: waiting() or bool(outcome), "the erasure waits, or ends")
        assert waiting(), f"the erasure did not wait for the rotation: {outcome}"
        rotation.commit()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        rotation.close()
    (raised,) = outcome
    assert isinstance(raised, ErasureRefused), raised
    assert "key 2" in str(raised)
    assert db.execute("SELECT count(*) FROM erased_operation").fetchone() == (0,)


def test_every_inbox_path_of_a_bridge_on_the_old_key_refuses_once_an_erasure_missed_it(
    stores: Any, db: Db
) -> None:
    """The one-statement write of a batch of new operations, the careful write (a batch that
    was not all new, or with a key twice) and the write under a tenant backlog quota: each
    refuses, writing nothing, once an erasure hashed its tombstones under none of the
    process's keys; a process started with the current key writes as before."""
    old_bridge = attached(stores, IdentityHasher(OLD))
    old_bridge.inbox.ingest([notify("erased", "t1"), notify("kept", "t1")])
    run_all(old_bridge)
    keyring.rotate(stores().keys, IdentityHasher(NEW, [OLD]), actor="ops", reason="leak")
    new_only = IdentityHasher(NEW)
    new_bridge = attached(stores, new_only)
    erase_operation(new_bridge, new_only, "t1", "erased")

    batches = {
        "new operations": [notify("fresh-1", "t1"), notify("fresh-2", "t1")],
        "an erased operation": [notify("erased", "t1")],
        "a replay": [notify("kept", "t1"), notify("fresh-3", "t1")],
        "a key twice": [notify("fresh-4", "t1"), notify("fresh-4", "t1")],
    }
    for name, batch in batches.items():
        with pytest.raises(IdentityKeysOutdated, match="restart it with") as refused:
            old_bridge.inbox.ingest(batch)
        assert "key 2, the current key" in str(refused.value), name
    with pytest.raises(IdentityKeysOutdated):
        old_bridge.inbox.ingest_within_quota([notify("fresh-5", "t1")], 10)
    assert db.execute("SELECT operation_id FROM work_item").fetchall() == [("kept",)]

    results = new_bridge.inbox.ingest([notify("erased", "t1"), notify("fresh-1", "t1")])
    assert [(r.decision, r.erased) for r in results] == [
        (Decision.REPLAY, True),
        (Decision.NEW, False),
    ]


def test_an_erasure_that_commits_while_an_old_bridges_insert_waits_on_its_row_is_seen(
    stores: Any, db_url: str, db: Db
) -> None:
    """The erasure (new key alone) deletes the row and marks the old key, and is held before
    it commits; the old bridge's insert of that operation waits on the row, then goes on once
    the erasure commits. Its check reads the keys' marks after that wait, so it refuses: the
    statement's own snapshot, taken before the wait, would have let the erased operation in
    as new work."""
    old_bridge = attached(stores, IdentityHasher(OLD))
    old_bridge.inbox.ingest([notify("erased", "t1")])
    run_all(old_bridge)
    keyring.rotate(stores().keys, IdentityHasher(NEW, [OLD]), actor="ops", reason="leak")
    new_only = IdentityHasher(NEW)
    eraser = attached(stores, new_only)
    # Holds the erasure after it deleted the row, wrote the tombstone and marked the old key:
    # it waits for this lock on a table it deletes from later.
    blocker: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(db_url)
    outcome: list[BaseException | None] = []
    try:
        blocker.execute("LOCK TABLE shadow_delivery IN ACCESS EXCLUSIVE MODE")
        erasing = threading.Thread(target=lambda: erase_operation(eraser, new_only, "t1", "erased"))
        erasing.start()
        eventually(lambda: waiting_on(db, "relation"), "the erasure waits on the blocker")

        def write() -> None:
            try:
                old_bridge.inbox.ingest([notify("erased", "t1"), notify("other", "t1")])
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001  (asserted below)
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        eventually(lambda: waiting_on(db, "transactionid"), "the insert waits on the erasure")
        blocker.rollback()  # the erasure goes on and commits; then the insert goes on
        erasing.join(30)
        writer.join(30)
    finally:
        blocker.close()  # a failed wait above must not leave the erasure blocked
    (raised,) = outcome
    assert isinstance(raised, IdentityKeysOutdated), raised
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)
    assert db.execute("SELECT key_id FROM erased_operation").fetchall() == [(2,)]
