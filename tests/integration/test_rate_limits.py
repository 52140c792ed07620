"""Rate limits that follow the target: a RateLimited outcome parks its (job type, tenant).

The row goes back to the queue after the target's wait without using up an attempt, under its
fence, and every row of the same job type and tenant waits as long; other keys are claimed
meanwhile. Time here is the store's clock (``clocked``): nothing sleeps.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bridge import keyring
from bridge.errors import LeaseLost
from bridge.identity import IdentityHasher
from bridge.operator.rate_waits import LIFTED_MARK, lift_rate_waits
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Claim, Key, State
from tests.support.clock import EPOCH as START
from tests.support.clock import Clock
from tests.support.deliveries import delivery

LEASE = timedelta(seconds=30)

Db = psycopg.Connection[tuple[Any, ...]]


def row(db: Db, op: str, tenant: str = "t1") -> tuple[Any, ...]:
    found = db.execute(
        "SELECT state, fence, attempts, next_attempt_at, outcome_code"
        "  FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (tenant, op),
    ).fetchone()
    assert found is not None
    return found


def waits(db: Db) -> dict[tuple[str, str], Any]:
    rows = db.execute("SELECT job_type, tenant_id, until FROM rate_wait").fetchall()
    return {(job, tenant): until for job, tenant, until in rows}


def keys(claims: list[Claim]) -> set[tuple[str, str]]:
    return {(c.tenant_id, c.operation_id) for c in claims}


def claim_one(store: PostgresStore, op: str, tenant: str = "t1") -> Claim:
    (claim,) = store.claims.claim_keys("w1", [Key(tenant, op)], LEASE)
    return claim


def test_a_rate_limit_parks_the_key_without_using_an_attempt_while_other_tenants_run(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a"), delivery("b"), delivery("c", tenant="t2")])
    first = claim_one(clocked, "a")
    assert first.attempts == 1

    clocked.settle.rate_limited(first.ticket, timedelta(seconds=2))

    assert row(db, "a") == ("queued", 1, 0, START + timedelta(seconds=2), "rate_limited")
    assert waits(db) == {("refund", "t1"): START + timedelta(seconds=2)}
    attempt = db.execute(
        "SELECT outcome, outcome_code, ended_at FROM work_attempt"
        " WHERE operation_id = 'a' AND fence = 1"
    ).fetchone()
    assert attempt == ("queued", "rate_limited", START)

    # The limited row and its sibling of the same tenant and job type wait; t2 does not.
    assert keys(clocked.claims.claim("w2", 10, LEASE)) == {("t2", "c")}
    assert clocked.claims.claim_keys("w2", [Key("t1", "a"), Key("t1", "b")], LEASE) == []
    clock.advance(timedelta(seconds=1.999))
    assert clocked.claims.claim("w2", 10, LEASE) == []

    clock.advance(timedelta(milliseconds=1))
    again = {c.operation_id: c for c in clocked.claims.claim("w2", 10, LEASE)}
    assert set(again) == {"a", "b"}
    assert (again["a"].attempts, again["a"].fence) == (1, 2)
    assert again["b"].attempts == 1


def test_rate_limits_never_exhaust_the_attempts(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a", max_attempts=1)])
    for _ in range(3):
        claim = claim_one(clocked, "a")
        assert (claim.attempts, claim.max_attempts) == (1, 1)
        clocked.settle.rate_limited(claim.ticket, timedelta(seconds=5))
        clock.advance(timedelta(seconds=5))
    assert row(db, "a")[:3] == ("queued", 3, 0)
    assert claim_one(clocked, "a").attempts == 1


def test_a_hand_off_claim_respects_the_wait(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery("a")])
    clocked.settle.rate_limited(claim_one(clocked, "a").ticket, timedelta(seconds=10))
    clocked.inbox.ingest([delivery("b")])  # a new row of the waiting key, handed off at once
    assert clocked.claims.claim_keys("w1", [Key("t1", "b")], LEASE) == []
    clock.advance(timedelta(seconds=10))
    assert keys(clocked.claims.claim_keys("w1", [Key("t1", "b")], LEASE)) == {("t1", "b")}


def test_an_expired_lease_of_a_waiting_key_is_taken_over_only_after_the_wait(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("held"), delivery("limited")])
    held = claim_one(clocked, "held")
    clocked.settle.rate_limited(claim_one(clocked, "limited").ticket, LEASE * 3)
    clock.advance(LEASE * 2)  # held's lease has expired, the wait has not
    assert clocked.claims.claim("w2", 10, LEASE) == []
    assert clocked.claims.claim_keys("w2", [Key("t1", "held")], LEASE) == []
    assert row(db, "held")[:2] == ("claimed", held.fence)

    clock.advance(LEASE)
    taken = {c.operation_id: c for c in clocked.claims.claim("w2", 10, LEASE)}
    assert set(taken) == {"held", "limited"}
    assert taken["held"].takeover
    assert taken["held"].fence == held.fence + 1


def test_a_stale_tickets_rate_limit_is_refused_and_changes_nothing(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    stale = claim_one(clocked, "a")
    clock.advance(LEASE + timedelta(seconds=1))
    current = claim_one(clocked, "a")
    assert current.takeover
    before = row(db, "a")

    with pytest.raises(LeaseLost):
        clocked.settle.rate_limited(stale.ticket, timedelta(seconds=60))

    assert row(db, "a") == before
    assert before[:3] == ("claimed", 2, 2)
    assert waits(db) == {}
    assert keys(clocked.claims.claim_keys("w3", [Key("t1", "a")], LEASE)) == set()  # still held


def test_a_settled_rows_rate_limit_is_refused(clocked: PostgresStore, db: Db) -> None:
    clocked.inbox.ingest([delivery("a")])
    claim = claim_one(clocked, "a")
    clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    with pytest.raises(LeaseLost):
        clocked.settle.rate_limited(claim.ticket, timedelta(seconds=60))
    assert row(db, "a")[0] == "succeeded"
    assert waits(db) == {}


def test_the_later_wait_wins_and_passed_waits_of_the_tenant_are_removed(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest(
        [
            delivery("a"),
            delivery("b"),
            delivery("x", job_type="other"),
            delivery("y", tenant="t2"),
        ]
    )
    clocked.settle.rate_limited(claim_one(clocked, "x").ticket, timedelta(seconds=1))
    clocked.settle.rate_limited(claim_one(clocked, "y", "t2").ticket, timedelta(seconds=1))
    a, b = claim_one(clocked, "a"), claim_one(clocked, "b")
    clocked.settle.rate_limited(a.ticket, timedelta(seconds=30))
    assert len(waits(db)) == 3  # nothing had passed yet

    clock.advance(timedelta(seconds=1))
    clocked.settle.rate_limited(b.ticket, timedelta(seconds=5))  # shorter than a's: a's wait stays
    assert waits(db) == {
        ("refund", "t1"): START + timedelta(seconds=30),
        ("refund", "t2"): START + timedelta(seconds=1),  # another tenant's: left alone
    }
    assert row(db, "b")[3] == START + timedelta(seconds=6)
    clock.advance(timedelta(seconds=5))
    assert keys(clocked.claims.claim("w1", 10, LEASE)) == {("t1", "x"), ("t2", "y")}


def test_a_tenant_role_sees_only_its_own_waits(clocked: PostgresStore, db: Db) -> None:
    clocked.inbox.ingest([delivery("a"), delivery("b", tenant="t2")])
    clocked.settle.rate_limited(claim_one(clocked, "a").ticket, timedelta(seconds=60))
    clocked.settle.rate_limited(claim_one(clocked, "b", "t2").ticket, timedelta(seconds=60))
    role = f"fbt_rate_{secrets.token_hex(4)}"
    db.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        db.execute(
            sql.SQL("GRANT SELECT ON rate_wait, tenant_role TO {}").format(sql.Identifier(role))
        )
        db.execute("INSERT INTO tenant_role (role_name, tenant_id) VALUES (%s, 't1')", (role,))
        with db.transaction(force_rollback=True):
            db.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            seen = db.execute("SELECT tenant_id FROM rate_wait").fetchall()
        assert seen == [("t1",)]
    finally:
        db.execute("DELETE FROM tenant_role WHERE role_name = %s", (role,))
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_erasing_a_tenant_removes_its_waits(clocked: PostgresStore, clock: Clock, db: Db) -> None:
    clocked.inbox.ingest([delivery("a"), delivery("b", tenant="t2")])
    clocked.settle.rate_limited(claim_one(clocked, "a").ticket, timedelta(seconds=60))
    clocked.settle.rate_limited(claim_one(clocked, "b", "t2").ticket, timedelta(seconds=60))
    clock.advance(timedelta(seconds=61))
    clocked.settle.settle(
        Settlement(claim_one(clocked, "a").ticket, State.SUCCEEDED, "ok")
    )  # an erasure waits for a settled row
    keyring.attach(clocked.keys, IdentityHasher(b"rate-limits-test-identity-key"), used_by="test")
    counts = clocked.operator.erase("t1", tenant_hash="h1", actor="dpo", reason="request 9")
    assert counts.work_rows == 1
    assert set(waits(db)) == {("refund", "t2")}


def test_lifting_a_wait_makes_the_rows_it_scheduled_due_now_each_audited(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery(op) for op in ("limited", "held", "backoff", "later")])
    clocked.inbox.ingest([delivery("other", tenant="t2"), delivery("job", job_type="other")])
    clocked.settle.retry_later(claim_one(clocked, "backoff").ticket, timedelta(minutes=5))
    clocked.settle.retry_later(claim_one(clocked, "later").ticket, timedelta(hours=2))
    clocked.settle.rate_limited(claim_one(clocked, "limited").ticket, timedelta(hours=1))
    clocked.settle.rate_limited(claim_one(clocked, "other", "t2").ticket, timedelta(hours=1))
    clocked.settle.rate_limited(claim_one(clocked, "job").ticket, timedelta(hours=1))
    assert [w.queued for w in clocked.operator.rate_waits("refund")] == [4, 1]

    dry = lift_rate_waits(
        clocked.operator, "refund", tenant_id="t1", actor="alice", reason="INC-9", dry_run=True
    )
    assert [(w.tenant_id, w.until, w.moved) for w in dry.lifted] == [
        ("t1", START + timedelta(hours=1), 2)
    ]
    assert len(waits(db)) == 3  # a dry run writes nothing
    assert clocked.claims.claim("w", 10, LEASE) == []

    report = lift_rate_waits(
        clocked.operator, "refund", tenant_id="t1", actor="alice", reason="INC-9"
    )

    assert (report.moved, [w.tenant_id for w in report.lifted]) == (2, ["t1"])
    assert set(waits(db)) == {("refund", "t2"), ("other", "t1")}  # other keys keep waiting
    # The refused row and the retry due within the wait are due now; the one due after the
    # wait keeps its backoff; the row the wait held (due already) is claimable again.
    assert {op: row(db, op)[3] for op in ("limited", "backoff", "later")} == {
        "limited": START,
        "backoff": START,
        "later": START + timedelta(hours=2),
    }
    assert keys(clocked.claims.claim("w", 10, LEASE)) == {
        ("t1", "limited"),
        ("t1", "held"),
        ("t1", "backoff"),
    }
    audit = db.execute(
        "SELECT operation_id, actor, reason, from_state, to_state FROM redrive_audit"
        " ORDER BY operation_id"
    ).fetchall()
    assert audit == [
        ("backoff", "alice", f"INC-9 {LIFTED_MARK}", "queued", "queued"),
        ("limited", "alice", f"INC-9 {LIFTED_MARK}", "queued", "queued"),
    ]
    history = db.execute(
        "SELECT operation_id, kind, outcome, outcome_code FROM work_attempt"
        " WHERE kind = 'redrive' ORDER BY operation_id"
    ).fetchall()
    assert history == [
        ("backoff", "redrive", "queued", "rate_wait_lifted"),
        ("limited", "redrive", "queued", "rate_wait_lifted"),
    ]
    # Nothing is left to lift for t1; every tenant's wait of the job type goes at once.
    assert (
        lift_rate_waits(clocked.operator, "refund", tenant_id="t1", actor="a", reason="r").lifted
        == []
    )
    everyone = lift_rate_waits(clocked.operator, "refund", actor="alice", reason="INC-9")
    assert [(w.tenant_id, w.moved) for w in everyone.lifted] == [("t2", 1)]
    assert set(waits(db)) == {("other", "t1")}


def test_a_lift_needs_an_actor_and_a_reason(clocked: PostgresStore) -> None:
    with pytest.raises(ValueError, match="an actor and a reason"):
        lift_rate_waits(clocked.operator, "refund", actor="alice", reason="")
    with pytest.raises(ValueError, match="an actor and a reason"):
        clocked.operator.lift_rate_waits("refund", actor="", reason="INC-9")
