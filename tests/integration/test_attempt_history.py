"""Attempt history: every claim, settlement, lease loss and redrive of an operation is recorded
by the statement that changes its work row, bounded per row and removed with it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.errors import LeaseLost
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore, Settlement
from bridge.store.records import AttemptRecord
from bridge.types import Key, RedriveFilter, State, TargetClass
from tests.support.clock import Clock
from tests.support.deliveries import delivery

LEASE = timedelta(seconds=30)
KEY = Key("t1", "a")

Db = psycopg.Connection[tuple[Any, ...]]


def attempts(store: PostgresStore, key: Key = KEY) -> tuple[AttemptRecord, ...]:
    return store.operator.history(key).attempts


def ends(store: PostgresStore) -> list[tuple[Any, ...]]:
    """(kind, fence, outcome, outcome_code) of each attempt, oldest first."""
    return [(a.kind, a.fence, a.outcome, a.outcome_code) for a in attempts(store)]


def test_a_claim_opens_one_attempt_and_its_settlement_ends_it(
    clocked: PostgresStore, clock: Clock
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    (opened,) = attempts(clocked)
    assert (opened.kind, opened.fence, opened.worker, opened.takeover) == ("claim", 1, "w1", False)
    assert (opened.started_at, opened.ended_at, opened.outcome) == (clock.at, None, None)

    clock.advance(timedelta(seconds=5))
    clocked.settle.settle(
        Settlement(
            claim.ticket,
            State.UNKNOWN,
            "provider_timeout",
            outcome_detail="detail stays on the row",
            error_class="Timeout",
        )
    )
    (ended,) = attempts(clocked)
    assert (ended.ended_at, ended.outcome, ended.outcome_code) == (
        clock.at,
        "unknown",
        "provider_timeout",
    )
    assert ended.error_class == "Timeout"


def test_a_takeover_ends_the_earlier_attempt_as_lease_lost_and_its_late_settlement_ends_nothing(
    clocked: PostgresStore, clock: Clock
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (old,) = clocked.claims.claim_keys("w1", [KEY], LEASE)
    clock.advance(LEASE * 2)
    (new,) = clocked.claims.claim("w2", 1, LEASE)
    assert new.takeover
    first, second = attempts(clocked)
    assert (first.fence, first.outcome, first.ended_at) == (1, "lease_lost", clock.at)
    assert (second.fence, second.worker, second.takeover, second.outcome) == (2, "w2", True, None)

    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(old.ticket, State.SUCCEEDED, "ok"))
    assert attempts(clocked) == (first, second)  # the refused settlement wrote nothing

    clocked.settle.settle_many([Settlement(t, State.SUCCEEDED, "ok") for t in [new.ticket]])
    assert ends(clocked) == [
        ("claim", 1, "lease_lost", "lease_expired"),
        ("claim", 2, "succeeded", "ok"),
    ]


def test_retry_release_and_sweep_each_end_the_attempt_they_move(
    clocked: PostgresStore, clock: Clock
) -> None:
    clocked.inbox.ingest([delivery("a", max_attempts=3)])
    (c1,) = clocked.claims.claim("w1", 1, LEASE)
    assert clocked.settle.retry_later(c1.ticket, timedelta(0), "busy", error="Busy") is State.QUEUED
    (c2,) = clocked.claims.claim("w1", 1, LEASE)
    clocked.settle.release(c2.ticket)
    clocked.claims.claim("w1", 1, LEASE)
    clock.advance(LEASE * 2)
    (c5,) = clocked.claims.claim("w2", 1, LEASE)  # takeover, with the last attempt left
    clock.advance(LEASE * 2)
    assert [t.fence for t in clocked.settle.sweep().parked] == [c5.fence]
    assert ends(clocked) == [
        ("claim", 1, "queued", "busy"),
        ("claim", 2, "released", "released"),
        ("claim", 3, "lease_lost", "lease_expired"),
        ("claim", 4, "lease_lost", "lease_expired_attempts_exhausted"),
    ]
    assert attempts(clocked)[0].error_class == "Busy"


def test_batch_settlement_ends_each_moved_attempt_with_its_own_outcome(
    store: PostgresStore,
) -> None:
    store.inbox.ingest([delivery("a"), delivery("b")])
    a, b = sorted(store.claims.claim("w1", 2, LEASE), key=lambda c: c.operation_id)
    stale = store.settle.settle_many(
        [
            Settlement(a.ticket, State.QUARANTINED, "bad_input", error_class="ValueError"),
            Settlement(b.ticket, State.SUCCEEDED, "ok", finding="applied"),
        ]
    )
    assert stale == []
    (qa,) = attempts(store, Key("t1", "a"))
    (sb,) = attempts(store, Key("t1", "b"))
    assert (qa.outcome, qa.outcome_code, qa.error_class, qa.finding) == (
        "quarantined",
        "bad_input",
        "ValueError",
        None,
    )
    assert (sb.outcome, sb.finding) == ("succeeded", "applied")


def test_a_redrive_is_recorded_and_the_next_claim_follows_it(store: PostgresStore) -> None:
    store.inbox.ingest([delivery("a")])
    (claim,) = store.claims.claim("w1", 1, LEASE)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "ambiguous"))
    store.operator.redrive(
        RedriveFilter(states=(State.UNKNOWN,)), actor="oncall", reason="provider fixed"
    )
    store.claims.claim("w1", 1, LEASE)
    assert ends(store) == [
        ("claim", 1, "unknown", "ambiguous"),
        ("redrive", 1, "queued", "redriven_from_unknown"),
        ("claim", 2, None, None),
    ]


def test_a_dry_run_redrive_records_nothing(store: PostgresStore) -> None:
    store.inbox.ingest([delivery("a")])
    (claim,) = store.claims.claim("w1", 1, LEASE)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "ambiguous"))
    store.operator.redrive(
        RedriveFilter(states=(State.UNKNOWN,)), actor="oncall", reason="preview", dry_run=True
    )
    assert [a.kind for a in attempts(store)] == ["claim"]


def test_only_the_newest_n_attempts_are_kept(store: PostgresStore) -> None:
    bounded = PostgresStore(store.pool, attempt_history=3)
    bounded.inbox.ingest([delivery("a", max_attempts=10)])
    for _ in range(5):
        (claim,) = bounded.claims.claim("w1", 1, LEASE)
        bounded.settle.retry_later(claim.ticket, timedelta(0))
    assert [a.fence for a in attempts(bounded)] == [3, 4, 5]


def test_history_off_records_no_claim(store: PostgresStore, db: Db) -> None:
    off = PostgresStore(store.pool, attempt_history=0)
    off.inbox.ingest([delivery("a"), delivery("b")])
    first, second = off.claims.claim("w1", 2, LEASE)
    off.settle.settle(Settlement(first.ticket, State.UNKNOWN, "provider_timeout"))
    off.settle.settle(Settlement(second.ticket, State.SUCCEEDED, "ok"))
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (0,)
    assert attempts(off, first.key) == ()
    assert off.operator.history(first.key).row is not None
    # A first attempt that succeeded is read from its row, recorded or not.
    assert [(a.fence, a.outcome) for a in attempts(off, second.key)] == [(1, "succeeded")]


def test_purge_and_erasure_remove_the_history_with_the_row(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a"), delivery("b", tenant="t2")])
    for claim in clocked.claims.claim("w1", 2, LEASE):
        clocked.settle.settle(Settlement(claim.ticket, State.FAILED_TERMINAL, "declined"))
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (2,)

    clock.advance(timedelta(days=40))
    counts = clocked.operator.purge_batch(timedelta(days=30), 1)
    assert counts is not None
    assert counts.work_rows == 1
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (1,)

    keyring.attach(
        clocked.keys, IdentityHasher(b"attempt-history-test-identity-key"), used_by="test"
    )
    clocked.operator.erase("t2", tenant_hash="h2", actor="dpo", reason="request 7")
    clocked.operator.erase("t1", tenant_hash="h1", actor="dpo", reason="request 8")
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (0,)


def test_a_running_attempt_is_the_work_row_and_is_recorded_once_when_it_ends(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    """The claim writes no record (half the history's cost): the attempt still running is read
    from the row, and the statement that ends it writes its one record."""
    clocked.inbox.ingest([delivery(op) for op in "abc"])
    claims = clocked.claims.claim("w1", 3, LEASE)
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (0,)
    (running,) = attempts(clocked)
    assert (running.fence, running.worker, running.started_at, running.ended_at) == (
        1,
        "w1",
        clock.at,
        None,
    )
    clock.advance(timedelta(seconds=2))
    settlements = [Settlement(c.ticket, State.FAILED_TERMINAL, "declined") for c in claims]
    assert clocked.settle.settle_many(settlements) == []
    rows = db.execute(
        "SELECT operation_id, fence, worker, started_at, ended_at, outcome FROM work_attempt"
        " ORDER BY operation_id"
    ).fetchall()
    assert rows == [
        (op, 1, "w1", clock.at - timedelta(seconds=2), clock.at, "failed_terminal") for op in "abc"
    ]
    # The settled row keeps its last owner for that record; inspect shows no lease.
    row = clocked.operator.history(KEY).row
    assert row is not None
    assert row.lease_owner is None


def test_a_first_attempt_that_succeeded_is_its_row_and_every_other_ending_is_recorded(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    """The most common settlement, a first attempt's success with no error class and no
    finding, writes no record: succeeded is final, and the row holds all of it (claimed_at,
    settled_at, its last owner, the outcome), so the history reads it from there, the same as
    a record. A success under a later fence, or with a lookup's finding, is recorded; so is an
    unknown the operator later confirmed applied, whose record the row does not replace."""
    batch = [delivery(op, max_attempts=3) for op in ("first", "later", "found")]
    clocked.inbox.ingest([*batch, replace(delivery("fixed"), target_class=TargetClass.C)])
    claims = {c.operation_id: c for c in clocked.claims.claim("w1", 4, LEASE)}
    first, later, found, fixed = (claims[op] for op in ("first", "later", "found", "fixed"))
    clock.advance(timedelta(seconds=3))
    clocked.settle.settle(Settlement(first.ticket, State.SUCCEEDED, "ok"))
    clocked.settle.retry_later(later.ticket, timedelta(0))
    clocked.settle.settle(Settlement(found.ticket, State.SUCCEEDED, "applied", finding="applied"))
    clocked.settle.settle(Settlement(fixed.ticket, State.UNKNOWN, "provider_timeout"))
    (again,) = clocked.claims.claim("w2", 1, LEASE)
    assert again.key == later.key
    clocked.settle.settle(Settlement(again.ticket, State.SUCCEEDED, "ok"))
    (seen,) = clocked.operator.parked(RedriveFilter(states=(State.UNKNOWN,)))
    assert clocked.operator.redrive_applied(
        seen, outcome_code="charged", outcome_detail=None, actor="oncall", reason="confirmed"
    )

    recorded = db.execute(
        "SELECT operation_id, fence, outcome FROM work_attempt WHERE kind = 'claim'"
        " ORDER BY operation_id, id"
    ).fetchall()
    assert recorded == [
        ("fixed", 1, "unknown"),
        ("found", 1, "succeeded"),
        ("later", 1, "queued"),
        ("later", 2, "succeeded"),
    ]
    (only,) = attempts(clocked, first.key)
    assert (only.kind, only.fence, only.worker, only.takeover) == ("claim", 1, "w1", False)
    assert (only.started_at, only.ended_at) == (clock.at - timedelta(seconds=3), clock.at)
    assert (only.outcome, only.outcome_code, only.error_class, only.finding) == (
        "succeeded",
        "ok",
        None,
        None,
    )
    assert [(a.fence, a.outcome) for a in attempts(clocked, later.key)] == [
        (1, "queued"),
        (2, "succeeded"),
    ]
    assert [(a.fence, a.outcome, a.finding) for a in attempts(clocked, found.key)] == [
        (1, "succeeded", "applied")
    ]
    assert [(a.kind, a.fence, a.outcome) for a in attempts(clocked, fixed.key)] == [
        ("claim", 1, "unknown"),
        ("redrive", 1, "succeeded"),
    ]


def test_an_attempt_left_open_by_an_earlier_version_is_not_shown_beside_its_record(
    store: PostgresStore, db: Db
) -> None:
    """An earlier version recorded attempts when they began: a row claimed by it and settled by
    this one has an entry that never ended beside the one its settlement wrote."""
    store.inbox.ingest([delivery("a")])
    (claim,) = store.claims.claim("w1", 1, LEASE)
    db.execute(
        "INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at)"
        " VALUES ('t1', 'a', 'claim', 1, 'w1', now())"
    )
    assert [(a.fence, a.ended_at) for a in attempts(store)] == [(1, None)]
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    assert ends(store) == [("claim", 1, "succeeded", "ok")]
