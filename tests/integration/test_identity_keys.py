"""Identity keys on real PostgreSQL: the fingerprint recorded on first use, the refusal of any
other key, and a rotation under which every operation keeps the key it was written under.

The class C case runs the demo's charge handler against the payment provider over HTTP: a
charge sent under key 1 by a worker that then died is found (or sent) under key 1's
idempotency key by a bridge restarted after the rotation, never under the new key.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.cli import main
from bridge.demo.payments import ChargeCustomer
from bridge.demo.provider import FaultKind, PaymentClient, PaymentProvider
from bridge.errors import IdentityKeyMismatch, IdentityKeyMissing
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import Ambiguous, Context, RetryPolicy
from bridge.identity import (
    IDENTITY_KEY_ENV,
    IDENTITY_PREVIOUS_KEYS_ENV,
    IdentityHasher,
    fingerprint,
    shown,
)
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, Key, State, TargetClass
from tests.support.clock import Clock
from tests.support.deliveries import for_job

Db = psycopg.Connection[Any]

KEY_1 = b"identity-keys-test-secret-one-0001"
KEY_2 = b"identity-keys-test-secret-two-0002"
STRANGER = b"identity-keys-test-secret-stranger"
LEASE = timedelta(seconds=30)
CHARGE = "charge_customer"


def delivery(op: str) -> Delivery:
    return Delivery(
        tenant_id="t1",
        operation_id=op,
        subscription="orders",
        job_type="notify",
        target_class=TargetClass.C,
        payload=b"{}",
    )


def recorded(db: Db) -> list[tuple[int, str]]:
    return [(int(i), f) for i, f in db.execute("SELECT key_id, fingerprint FROM identity_key")]


def row_keys(db: Db) -> dict[str, int]:
    rows = db.execute("SELECT operation_id, identity_key_id FROM work_item").fetchall()
    return {o: int(k) for o, k in rows}


@pytest.fixture
def second(db_url: str) -> Any:
    """Another process's store on the same database."""
    s = PostgresStore.connect(db_url, max_size=2)
    yield s
    s.close()


def test_the_first_use_records_a_fingerprint_never_the_key_and_the_same_key_is_accepted(
    store: PostgresStore, second: PostgresStore, db: Db
) -> None:
    hasher = IdentityHasher(KEY_1)
    keyring.attach(store.keys, hasher, used_by="fencebridge run")
    assert recorded(db) == [(1, fingerprint(KEY_1))]
    assert hasher.key_id == 1
    stored = db.execute("SELECT row_to_json(k)::text FROM identity_key k").fetchone()
    assert stored is not None
    assert KEY_1.decode() not in stored[0]

    again = IdentityHasher(KEY_1)
    keyring.attach(second.keys, again, used_by="fencebridge redrive")
    assert recorded(db) == [(1, fingerprint(KEY_1))]
    store.inbox.ingest([delivery("op-1")])
    assert row_keys(db) == {"op-1": 1}


def test_another_key_is_refused_naming_the_key_the_database_expects(
    store: PostgresStore, second: PostgresStore, db: Db
) -> None:
    keyring.attach(store.keys, IdentityHasher(KEY_1), used_by="fencebridge run")
    other = IdentityHasher(STRANGER)
    with pytest.raises(IdentityKeyMismatch) as refused:
        keyring.attach(second.keys, other, used_by="fencebridge run")
    message = str(refused.value)
    assert f"key 1 (fingerprint {shown(fingerprint(KEY_1))})" in message
    assert "the deployment's key" in message
    assert "openssl" not in message
    assert STRANGER.decode() not in message
    assert recorded(db) == [(1, fingerprint(KEY_1))], "a refused key is not recorded"
    assert other.key_id is None, "a refused hasher learns no key ids"
    # Commands that only show hashes compare too.
    with pytest.raises(IdentityKeyMismatch):
        keyring.verify(second.keys, IdentityHasher(STRANGER))


def test_of_two_first_uses_at_once_one_key_is_recorded_and_the_other_refused(
    db_url: str, db: Db
) -> None:
    stores = [PostgresStore.connect(db_url, max_size=1) for _ in range(2)]
    start = threading.Barrier(2)
    outcomes: dict[int, str] = {}

    def first_use(i: int, secret: bytes) -> None:
        start.wait()
        try:
            keyring.attach(stores[i].keys, IdentityHasher(secret), used_by="fencebridge run")
            outcomes[i] = "accepted"
        except IdentityKeyMismatch:
            outcomes[i] = "refused"

    threads = [
        threading.Thread(target=first_use, args=(i, s)) for i, s in enumerate((KEY_1, KEY_2))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert sorted(outcomes.values()) == ["accepted", "refused"]
    winner = (KEY_1, KEY_2)[next(i for i, o in outcomes.items() if o == "accepted")]
    assert recorded(db) == [(1, fingerprint(winner))]


def test_a_command_that_only_shows_hashes_records_nothing(store: PostgresStore, db: Db) -> None:
    keyring.verify(store.keys, IdentityHasher(KEY_1))
    assert recorded(db) == []


def test_a_first_use_that_is_refused_records_nothing(store: PostgresStore, db: Db) -> None:
    with pytest.raises(IdentityKeyMismatch, match="never recorded"):
        keyring.attach(store.keys, IdentityHasher(KEY_1, [KEY_2]), used_by="fencebridge run")
    assert recorded(db) == []


def test_a_rotation_keeps_every_existing_operations_key(
    store: PostgresStore, second: PostgresStore, db: Db
) -> None:
    old = IdentityHasher(KEY_1)
    keyring.attach(store.keys, old, used_by="fencebridge run")
    store.inbox.ingest([delivery(f"before-{i}") for i in range(3)])

    rotated = IdentityHasher(KEY_2, [KEY_1])
    rotation = keyring.rotate(second.keys, rotated, actor="ops", reason="yearly rotation")
    assert rotation.new is not None
    assert rotation.new.key_id == 2
    assert rotation.open_rows == {1: 3}
    keyring.attach(second.keys, rotated, used_by="fencebridge run")
    second.inbox.ingest([delivery(f"after-{i}") for i in range(2)])
    # The old bridge, still running, writes under its own key; rows never change key.
    store.inbox.ingest([delivery("late-old-bridge")])
    assert row_keys(db) == {
        **{f"before-{i}": 1 for i in range(3)},
        **{f"after-{i}": 2 for i in range(2)},
        "late-old-bridge": 1,
    }

    # The old bridge claims only what it can derive keys for: never a key 2 row.
    by_old = store.claims.claim("old", 10, LEASE)
    assert {c.operation_id for c in by_old} == {
        *(f"before-{i}" for i in range(3)),
        "late-old-bridge",
    }
    by_new = second.claims.claim("new", 10, LEASE)
    assert {c.operation_id for c in by_new} == {"after-0", "after-1"}

    # Every operation's idempotency key is the one derived under the key its row was written
    # with, whichever process derives it.
    for claim in by_old:
        want = IdentityHasher(KEY_1).idempotency_key("t1", claim.operation_id)
        assert Context.for_claim(claim, rotated).idempotency_key == want
        assert Context.for_claim(claim, old).idempotency_key == want
    for claim in by_new:
        want = IdentityHasher(KEY_2).idempotency_key("t1", claim.operation_id)
        assert Context.for_claim(claim, rotated).idempotency_key == want
        with pytest.raises(IdentityKeyMissing, match=IDENTITY_PREVIOUS_KEYS_ENV):
            Context.for_claim(claim, old)


def test_after_a_rotation_the_old_key_alone_and_a_missing_previous_key_are_refused(
    store: PostgresStore, second: PostgresStore, db: Db
) -> None:
    keyring.attach(store.keys, IdentityHasher(KEY_1), used_by="fencebridge run")
    store.inbox.ingest([delivery("open-under-1")])
    keyring.rotate(second.keys, IdentityHasher(KEY_2, [KEY_1]), actor="ops", reason="rotation")

    with pytest.raises(IdentityKeyMismatch, match="replaced with key 2") as stale:
        keyring.attach(second.keys, IdentityHasher(KEY_1), used_by="fencebridge run")
    assert IDENTITY_PREVIOUS_KEYS_ENV in str(stale.value)

    with pytest.raises(IdentityKeyMismatch, match=r"1 open operation\(s\) under key 1") as lacking:
        keyring.attach(second.keys, IdentityHasher(KEY_2), used_by="fencebridge run")
    assert f"add it to {IDENTITY_PREVIOUS_KEYS_ENV}" in str(lacking.value)

    with pytest.raises(IdentityKeyMismatch, match="never recorded"):
        keyring.attach(second.keys, IdentityHasher(KEY_2, [STRANGER]), used_by="fencebridge run")

    # Once no open row needs key 1, the new key alone is enough.
    (claim,) = store.claims.claim("old", 1, LEASE)
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    keyring.attach(second.keys, IdentityHasher(KEY_2), used_by="fencebridge run")


def test_a_rotation_is_refused_without_the_current_key_and_for_a_recorded_key(
    store: PostgresStore, db: Db
) -> None:
    keyring.attach(store.keys, IdentityHasher(KEY_1), used_by="fencebridge run")
    with pytest.raises(IdentityKeyMismatch, match=r"current key, key 1 .* is not in"):
        keyring.rotate(store.keys, IdentityHasher(KEY_2), actor="ops", reason="r")
    with pytest.raises(IdentityKeyMismatch, match="nothing to rotate"):
        keyring.rotate(store.keys, IdentityHasher(KEY_1), actor="ops", reason="r")
    dry = keyring.rotate(
        store.keys, IdentityHasher(KEY_2, [KEY_1]), actor="ops", reason="r", dry_run=True
    )
    assert dry.new is not None
    assert dry.new.key_id == 2
    assert recorded(db) == [(1, fingerprint(KEY_1))], "a dry run records nothing"
    keyring.rotate(store.keys, IdentityHasher(KEY_2, [KEY_1]), actor="ops", reason="r")
    with pytest.raises(IdentityKeyMismatch, match="never brought back"):
        keyring.rotate(store.keys, IdentityHasher(KEY_1, [KEY_2]), actor="ops", reason="r")


def test_a_first_rotation_records_the_key_rows_were_written_under_as_key_1(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("written-before-keys-were-recorded")])
    keyring.rotate(store.keys, IdentityHasher(KEY_2, [KEY_1]), actor="ops", reason="r")
    assert recorded(db) == [(1, fingerprint(KEY_1)), (2, fingerprint(KEY_2))]
    assert row_keys(db) == {"written-before-keys-were-recorded": 1}


def test_a_class_c_charge_sent_under_key_1_is_looked_up_and_sent_under_key_1_after_rotation(
    store: PostgresStore, second: PostgresStore, db: Db
) -> None:
    clock = Clock()
    old_store = PostgresStore(store.pool, clock=clock)
    new_store = PostgresStore(second.pool, clock=clock)
    with PaymentProvider() as provider:
        handler = ChargeCustomer(PaymentClient(provider.url, timeout=2.0))
        registry = Registry()
        registry.register(CHARGE, handler, retry=RetryPolicy(max_attempts=5))
        old = IdentityHasher(KEY_1)
        keyring.attach(old_store.keys, old, used_by="fencebridge run")
        charge = {"amount": 1200, "currency": "eur", "reference": "order-1"}
        old_store.inbox.ingest(
            [for_job(registry, CHARGE, op, charge) for op in ("applied", "lost")]
        )
        key_1 = {op: old.idempotency_key("t1", op) for op in ("applied", "lost")}
        key_2 = {op: IdentityHasher(KEY_2).idempotency_key("t1", op) for op in key_1}

        # Attempt 1, under key 1: both requests leave; "applied" lands, "lost" is reset before
        # it is applied. The worker dies before settling either.
        provider.set_fault(FaultKind.RESET_BEFORE_APPLY, key=key_1["lost"])
        for claim in old_store.claims.claim("old", 2, LEASE):
            ctx = Context.for_claim(claim, old)
            assert ctx.idempotency_key == key_1[claim.operation_id]
            if claim.operation_id == "lost":
                with pytest.raises(Ambiguous):
                    handler.perform(ctx, ctx.idempotency_key)
            else:
                handler.perform(ctx, ctx.idempotency_key)
        assert provider.charges_for(key_1["applied"]) == 1
        assert provider.charges_for(key_1["lost"]) == 0

        # Rotation; the bridge restarted with the new key (and key 1 as previous) takes over.
        rotated = IdentityHasher(KEY_2, [KEY_1])
        keyring.rotate(new_store.keys, rotated, actor="ops", reason="rotation")
        keyring.attach(new_store.keys, rotated, used_by="fencebridge run")
        clock.advance(LEASE * 2)
        claims = new_store.claims.claim("new", 2, LEASE)
        assert {c.operation_id: c.attempts for c in claims} == {"applied": 2, "lost": 2}
        for claim in claims:
            spec = registry[claim.job_type]
            ctx = Context.for_claim(claim, rotated)
            execute(Run(new_store.settle, claim, spec, ctx, EventCounter()))

        states = dict(db.execute("SELECT operation_id, state FROM work_item").fetchall())
        assert states == {"applied": State.SUCCEEDED.value, "lost": State.SUCCEEDED.value}
        for op in ("applied", "lost"):
            assert provider.charges_for(key_1[op]) == 1, "one charge, under key 1's key"
            assert provider.lookups_for(key_1[op]) == 1, "looked up under key 1's key first"
            assert provider.requests_for(key_2[op]) == 0
            assert provider.lookups_for(key_2[op]) == 0
        assert provider.requests_for(key_1["applied"]) == 1, "found applied: not sent again"
        assert provider.requests_for(key_1["lost"]) == 2, "not applied: sent again, same key"
        assert len(provider.ledger()) == 2


def test_a_hasher_that_consulted_no_database_derives_key_1_rows_only(store: PostgresStore) -> None:
    store.inbox.ingest([delivery("unbound")])
    (claim,) = store.claims.claim_keys("w", [Key("t1", "unbound")], LEASE)
    hasher = IdentityHasher(KEY_1)
    assert Context.for_claim(claim, hasher).idempotency_key == hasher.idempotency_key(
        "t1", "unbound"
    )
    with pytest.raises(IdentityKeyMissing):
        Context.for_claim(dataclasses.replace(claim, identity_key_id=2), hasher)


@pytest.mark.promise("identity-key")
def test_no_command_records_a_first_key_only_identity_init_does(
    db_url: str, db: Db, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(IDENTITY_KEY_ENV, KEY_1.decode())
    erase = ["erase", "--tenant", "t1", "--reason", "DSR-1", "--database-url", db_url]
    assert main([*erase, "--dry-run"]) == 0
    assert "nothing was written" in capsys.readouterr().out
    assert recorded(db) == []
    assert main(erase) == 1
    assert "fencebridge identity init" in capsys.readouterr().err
    assert recorded(db) == []
    assert main(["identity", "init", "--reason", "first", "--database-url", db_url]) == 0
    assert recorded(db) == [(1, fingerprint(KEY_1))]
    assert main(erase) == 0
