"""Fenced writes: heartbeat, settlement, intent, class A transactions, sweep, redrive, stats.

Every write carries its fence; a stale one raises LeaseLost and changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.errors import LeaseLost
from bridge.store import PostgresStore, Settlement, Swept
from bridge.store.work import UNSTARTED_CLAIMS_MAX
from bridge.types import (
    Claim,
    Key,
    RedriveFilter,
    Redriven,
    Rejection,
    State,
    StateCount,
    TargetClass,
    Ticket,
)
from tests.support.clock import EPOCH as START
from tests.support.clock import Clock
from tests.support.deliveries import delivery

LEASE = timedelta(seconds=30)

Db = psycopg.Connection[tuple[Any, ...]]


def work_rows(db: Db) -> list[tuple[Any, ...]]:
    """The whole work table, for 'nothing changed' assertions."""
    return db.execute("SELECT * FROM work_item ORDER BY tenant_id, operation_id").fetchall()


def one(db: Db, op: str, columns: str, tenant: str = "t1") -> tuple[Any, ...]:
    query = f"SELECT {columns} FROM work_item WHERE tenant_id = %s AND operation_id = %s"
    found = db.execute(query, (tenant, op)).fetchone()
    assert found is not None
    return found


def taken_over(store: PostgresStore, clock: Clock, op: str = "a") -> tuple[Claim, Claim]:
    """Claim ``op``, let the lease lapse and claim it again: (stale claim, current claim)."""
    store.inbox.ingest([delivery(op)])
    (old,) = store.claims.claim_keys("w1", [Key("t1", op)], LEASE)
    clock.advance(LEASE * 2)
    (new,) = store.claims.claim_keys("w2", [Key("t1", op)], LEASE)
    assert (old.fence, new.fence) == (1, 2)
    return old, new


# -- heartbeat ---------------------------------------------------------------------------------


def test_heartbeat_extends_the_lease(clocked: PostgresStore, clock: Clock, db: Db) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    clock.advance(timedelta(seconds=20))
    expires = clocked.settle.heartbeat(claim.ticket, LEASE)
    assert expires == START + timedelta(seconds=50)
    assert one(db, "a", "lease_expires_at, lease_owner") == (expires, "w1")
    clock.advance(timedelta(seconds=25))  # past the first lease, inside the extended one
    assert clocked.claims.claim("w2", 1, LEASE) == []
    clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))


def test_stale_heartbeat_raises_and_leaves_the_new_lease_alone(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    old, new = taken_over(clocked, clock)
    before = work_rows(db)
    clock.advance(timedelta(seconds=10))
    with pytest.raises(LeaseLost) as lost:
        clocked.settle.heartbeat(old.ticket, LEASE)
    assert (lost.value.fence, lost.value.action) == (1, "heartbeat")
    assert "t1" not in str(lost.value)  # identifiers stay out of messages
    assert work_rows(db) == before
    assert one(db, "a", "lease_expires_at")[0] == new.lease_expires_at


def test_heartbeat_after_settlement_raises(clocked: PostgresStore) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    with pytest.raises(LeaseLost):
        clocked.settle.heartbeat(claim.ticket, LEASE)


# -- settlement --------------------------------------------------------------------------------

SETTLE: dict[str, Callable[[PostgresStore, Ticket], object]] = {
    "complete": lambda s, t: s.settle.settle(
        Settlement(t, State.SUCCEEDED, "ok", outcome_detail="done")
    ),
    "fail_terminal": lambda s, t: s.settle.settle(
        Settlement(t, State.FAILED_TERMINAL, "declined", outcome_detail="card declined")
    ),
    "park_unknown": lambda s, t: s.settle.settle(
        Settlement(t, State.UNKNOWN, "timeout", outcome_detail="no answer")
    ),
    "quarantine": lambda s, t: s.settle.settle(
        Settlement(t, State.QUARANTINED, "bad_schema", outcome_detail="v9")
    ),
    "retry_later": lambda s, t: s.settle.retry_later(t, timedelta(seconds=5), "busy", "429"),
    "record_intent": lambda s, t: s.settle.record_intent(t),
}

SETTLED_AS = {
    "complete": ("succeeded", "ok", "done"),
    "fail_terminal": ("failed_terminal", "declined", "card declined"),
    "park_unknown": ("unknown", "timeout", "no answer"),
    "quarantine": ("quarantined", "bad_schema", "v9"),
    "retry_later": ("queued", "busy", "429"),
}


@pytest.mark.promise("fence-refusal")
@pytest.mark.parametrize("method", sorted(SETTLE))
def test_every_fenced_write_with_a_stale_fence_raises_and_changes_nothing(
    clocked: PostgresStore, clock: Clock, db: Db, method: str
) -> None:
    old, _ = taken_over(clocked, clock)
    before = work_rows(db)
    with pytest.raises(LeaseLost) as lost:
        SETTLE[method](clocked, old.ticket)
    assert lost.value.fence == 1
    assert work_rows(db) == before


@pytest.mark.parametrize("method", sorted(SETTLE))
def test_every_fenced_write_with_a_future_fence_raises(
    clocked: PostgresStore, db: Db, method: str
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    before = work_rows(db)
    with pytest.raises(LeaseLost):
        SETTLE[method](clocked, Ticket("t1", "a", claim.fence + 1))
    assert work_rows(db) == before


@pytest.mark.parametrize("method", sorted(SETTLED_AS))
def test_settlement_under_the_current_fence(
    clocked: PostgresStore, clock: Clock, db: Db, method: str
) -> None:
    _, new = taken_over(clocked, clock)
    clock.advance(timedelta(seconds=1))
    SETTLE[method](clocked, new.ticket)
    state, code, detail = SETTLED_AS[method]
    columns = "state, outcome_code, outcome_detail, fence, attempts, lease_owner, lease_expires_at"
    # The lease ends; the row keeps its last owner (the one whose fence settled it).
    assert one(db, "a", columns) == (state, code, detail, 2, 2, "w2", None)
    settled_at = one(db, "a", "settled_at")[0]
    assert settled_at == (None if state == "queued" else clock())


@pytest.mark.parametrize("method", sorted(SETTLE))
def test_a_settled_row_refuses_every_later_write(
    clocked: PostgresStore, db: Db, method: str
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    before = work_rows(db)
    with pytest.raises(LeaseLost):
        SETTLE[method](clocked, claim.ticket)
    assert work_rows(db) == before


def test_retry_later_with_no_attempt_left_is_failed_terminal(
    clocked: PostgresStore, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a", max_attempts=2)])
    (first,) = clocked.claims.claim("w1", 1, LEASE)
    assert clocked.settle.retry_later(first.ticket, timedelta(0), "busy") is State.QUEUED
    (second,) = clocked.claims.claim("w1", 1, LEASE)
    assert second.attempts == 2
    assert clocked.settle.retry_later(second.ticket, timedelta(0), "busy") is State.FAILED_TERMINAL
    assert one(db, "a", "state, outcome_code, attempts, fence, lease_expires_at") == (
        "failed_terminal",
        "attempts_exhausted",
        2,
        2,
        None,
    )
    assert clocked.claims.claim("w1", 1, LEASE) == []


# -- batch writes ------------------------------------------------------------------------------


@pytest.fixture
def mixed(clocked: PostgresStore, clock: Clock) -> tuple[list[Ticket], list[Ticket], list[Claim]]:
    """Four claims of which two were taken over: (current tickets, stale tickets, new claims)."""
    clocked.inbox.ingest([delivery(op) for op in ("a", "b", "c", "d")])
    first = {c.operation_id: c for c in clocked.claims.claim("w1", 4, LEASE)}
    clock.advance(timedelta(seconds=20))
    clocked.settle.heartbeat_many([first["a"].ticket, first["c"].ticket], LEASE)
    clock.advance(timedelta(seconds=20))
    taken = clocked.claims.claim("w2", 4, LEASE)
    assert sorted(c.operation_id for c in taken) == ["b", "d"]
    current = [first["a"].ticket, first["c"].ticket]
    stale = [first["b"].ticket, first["d"].ticket]
    return current, stale, taken


def test_heartbeat_many_returns_exactly_the_stale_tickets(
    clocked: PostgresStore, clock: Clock, db: Db, mixed: tuple[list[Ticket], list[Ticket], Any]
) -> None:
    current, stale, taken = mixed
    leases = dict(
        db.execute("SELECT operation_id, lease_expires_at FROM work_item WHERE fence = 2")
    )
    assert clocked.settle.heartbeat_many([*stale, *current], LEASE) == stale
    expiries = dict(db.execute("SELECT operation_id, lease_expires_at FROM work_item"))
    assert expiries["a"] == expiries["c"] == clock() + LEASE
    assert {k: expiries[k] for k in leases} == leases  # the new holders' leases are untouched
    assert clocked.settle.heartbeat_many([], LEASE) == []
    assert clocked.settle.heartbeat_many([c.ticket for c in taken], LEASE) == []


def test_settle_many_returns_exactly_the_stale_tickets(
    clocked: PostgresStore, db: Db, mixed: tuple[list[Ticket], list[Ticket], list[Claim]]
) -> None:
    current, stale, taken = mixed
    result = clocked.settle.settle_many(
        [
            Settlement(stale[0], State.SUCCEEDED, "ok"),
            Settlement(current[0], State.UNKNOWN, "timeout", "no answer"),
            Settlement(stale[1], State.FAILED_TERMINAL, "declined"),
            Settlement(current[1], State.QUARANTINED, "bad_schema"),
        ]
    )
    assert result == stale
    states = db.execute(
        "SELECT operation_id, state, fence, outcome_code, outcome_detail FROM work_item ORDER BY 1"
    ).fetchall()
    assert states == [
        ("a", "unknown", 1, "timeout", "no answer"),
        ("b", "claimed", 2, None, None),
        ("c", "quarantined", 1, "bad_schema", None),
        ("d", "claimed", 2, None, None),
    ]
    assert (
        clocked.settle.settle_many(
            [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in taken]]
        )
        == []
    )
    assert clocked.settle.settle_many([]) == []


def test_complete_many_returns_exactly_the_stale_tickets(
    clocked: PostgresStore, db: Db, mixed: tuple[list[Ticket], list[Ticket], list[Claim]]
) -> None:
    current, stale, _ = mixed
    assert (
        clocked.settle.settle_many(
            [
                Settlement(t, State.SUCCEEDED, "done")
                for t in [current[0], stale[0], current[1], stale[1]]
            ]
        )
        == stale
    )
    assert db.execute(
        "SELECT operation_id, state, outcome_code FROM work_item ORDER BY 1"
    ).fetchall() == [
        ("a", "succeeded", "done"),
        ("b", "claimed", None),
        ("c", "succeeded", "done"),
        ("d", "claimed", None),
    ]


def test_batch_writes_judge_each_ticket_by_its_own_fence(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    """A worker that took over its own expired claim holds two tickets for one row."""
    old, new = taken_over(clocked, clock)
    assert clocked.settle.heartbeat_many([old.ticket, new.ticket], LEASE) == [old.ticket]
    assert clocked.settle.settle_many(
        [Settlement(t, State.SUCCEEDED, "ok") for t in [new.ticket, old.ticket]]
    ) == [old.ticket]
    assert one(db, "a", "state, fence") == ("succeeded", 2)


def test_settle_many_refuses_unsettled_target_states(clocked: PostgresStore) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    for state in (State.QUEUED, State.CLAIMED):
        with pytest.raises(ValueError, match="settled state"):
            clocked.settle.settle_many([Settlement(claim.ticket, state, "x")])


# -- sweep -------------------------------------------------------------------------------------


def test_sweep_parks_expired_exhausted_claims_as_unknown(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest(
        [
            delivery("exhausted", max_attempts=1),
            delivery("retryable", max_attempts=2),
            delivery("live", max_attempts=1),
        ]
    )
    claims = {c.operation_id: c for c in clocked.claims.claim("w1", 10, LEASE)}
    clock.advance(LEASE * 2)
    clocked.settle.heartbeat(claims["live"].ticket, LEASE)  # still making progress
    clock.advance(timedelta(seconds=1))

    parked = clocked.settle.sweep().parked
    assert parked == [Ticket("t1", "exhausted", 1)]
    assert one(
        db, "exhausted", "state, outcome_code, fence, attempts, lease_owner, settled_at"
    ) == ("unknown", "lease_expired_attempts_exhausted", 1, 1, "w1", clock())
    assert one(db, "live", "state, fence")[0] == "claimed"  # a live lease is never swept
    assert one(db, "retryable", "state")[0] == "claimed"  # left for a takeover, not parked
    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(claims["exhausted"].ticket, State.SUCCEEDED, "ok"))
    assert clocked.settle.sweep().parked == []

    (again,) = clocked.claims.claim("w2", 10, LEASE)
    assert (again.operation_id, again.takeover) == ("retryable", True)


def test_sweep_queues_again_a_class_d_claim_that_never_recorded_an_intent(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    unfenced = [
        replace(delivery(op, max_attempts=1), target_class=TargetClass.D)
        for op in ("never-started", "called")
    ]
    clocked.inbox.ingest([*unfenced, delivery("class-a", max_attempts=1)])
    claims = {c.operation_id: c for c in clocked.claims.claim("w1", 10, LEASE)}
    clocked.settle.record_intent(claims["called"].ticket)
    clock.advance(LEASE * 2)

    swept = clocked.settle.sweep()

    assert set(swept.parked) == {Ticket("t1", "called", 1), Ticket("t1", "class-a", 1)}
    assert swept.requeued == [Ticket("t1", "never-started", 1)]
    columns = (
        "state, outcome_code, attempts, max_attempts, intent_fence, next_attempt_at, settled_at"
    )
    # No intent: no call was made, so the claim is given another, as a redrive would.
    assert one(db, "never-started", columns) == (
        "queued",
        "lease_expired_not_started",
        1,
        2,
        None,
        clock(),
        None,
    )
    assert one(db, "called", columns) == (
        "unknown",
        "lease_expired_attempts_exhausted",
        1,
        1,
        1,
        START,
        clock(),
    )
    assert one(db, "class-a", "state")[0] == "unknown"
    with pytest.raises(LeaseLost):  # the dead claim's intent can never be recorded now
        clocked.settle.record_intent(claims["never-started"].ticket)
    attempts = db.execute(
        "SELECT operation_id, outcome, outcome_code FROM work_attempt ORDER BY operation_id"
    ).fetchall()
    assert attempts == [
        ("called", "lease_lost", "lease_expired_attempts_exhausted"),
        ("class-a", "lease_lost", "lease_expired_attempts_exhausted"),
        ("never-started", "lease_lost", "lease_expired_not_started"),
    ]
    (again,) = clocked.claims.claim("w2", 10, LEASE)
    assert (again.operation_id, again.fence, again.attempts, again.intent_fence) == (
        "never-started",
        2,
        2,
        None,
    )


def test_a_class_d_row_whose_every_claim_expires_before_its_call_is_parked_in_the_end(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([replace(delivery("op", max_attempts=1), target_class=TargetClass.D)])
    for attempt in range(1, UNSTARTED_CLAIMS_MAX):
        (claim,) = clocked.claims.claim("w1", 10, LEASE)
        assert (claim.attempts, claim.takeover) == (attempt, False)
        clock.advance(LEASE * 2)
        assert clocked.settle.sweep() == Swept([], [claim.ticket])
    (last,) = clocked.claims.claim("w1", 10, LEASE)
    assert last.attempts == UNSTARTED_CLAIMS_MAX
    clock.advance(LEASE * 2)

    # A row whose every claim dies before the call (one that takes its process down) stops.
    assert clocked.settle.sweep() == Swept([last.ticket], [])
    state, code, detail, intent = one(db, "op", "state, outcome_code, outcome_detail, intent_fence")
    assert (state, code, intent) == ("unknown", "lease_expired_attempts_exhausted", None)
    assert "never called" in detail
    assert clocked.claims.claim("w1", 10, LEASE) == []


def test_sweep_never_decides_success_or_failure(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery(f"op-{i}", max_attempts=1) for i in range(5)])
    clocked.claims.claim("w1", 10, LEASE)
    clock.advance(LEASE * 2)
    assert len(clocked.settle.sweep(limit=3).parked) == 3
    assert len(clocked.settle.sweep(limit=3).parked) == 2
    stats = clocked.operator.stats()
    assert stats.total(State.UNKNOWN) == 5
    assert stats.total(State.SUCCEEDED) == stats.total(State.FAILED_TERMINAL) == 0


# -- class D intent ----------------------------------------------------------------------------


def test_record_intent_is_fenced_and_seen_by_the_next_claim(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (first,) = clocked.claims.claim("w1", 1, LEASE)
    assert first.intent_fence is None
    clocked.settle.record_intent(first.ticket)
    assert one(db, "a", "intent_fence")[0] == 1
    clock.advance(LEASE * 2)
    (second,) = clocked.claims.claim("w2", 1, LEASE)
    assert (second.intent_fence, second.attempts) == (1, 2)
    with pytest.raises(LeaseLost):
        clocked.settle.record_intent(first.ticket)
    assert one(db, "a", "intent_fence")[0] == 1


# -- class A: fenced transactions ---------------------------------------------------------------


@pytest.fixture
def ledger(db: Db) -> None:
    db.execute("CREATE TABLE ledger (operation_id text PRIMARY KEY, amount integer NOT NULL)")


def ledger_rows(db: Db) -> list[tuple[Any, ...]]:
    return db.execute("SELECT operation_id, amount FROM ledger").fetchall()


def test_fenced_transaction_commits_business_write_and_settlement_together(
    clocked: PostgresStore, db: Db, ledger: None
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    with clocked.settle.fenced_transaction(claim.ticket) as tx:
        tx.connection.execute("INSERT INTO ledger VALUES ('a', 5)")
        tx.settle(State.SUCCEEDED, "ok")
        assert ledger_rows(db) == []  # not visible before COMMIT
        assert one(db, "a", "state")[0] == "claimed"
    assert tx.settled is State.SUCCEEDED
    assert ledger_rows(db) == [("a", 5)]
    assert one(db, "a", "state, outcome_code, lease_owner")[:2] == ("succeeded", "ok")


def test_fenced_transaction_rolls_both_back_on_error(
    clocked: PostgresStore, db: Db, ledger: None
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    before = work_rows(db)

    class HandlerError(Exception):
        pass

    def handler() -> None:
        with clocked.settle.fenced_transaction(claim.ticket) as tx:
            tx.connection.execute("INSERT INTO ledger VALUES ('a', 5)")
            tx.settle()
            raise HandlerError

    with pytest.raises(HandlerError):
        handler()
    assert ledger_rows(db) == []
    assert work_rows(db) == before
    clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))  # the claim is intact


def test_fenced_transaction_with_a_stale_ticket_never_runs_the_block(
    clocked: PostgresStore, clock: Clock, db: Db, ledger: None
) -> None:
    old, _ = taken_over(clocked, clock)
    before = work_rows(db)
    ran: list[bool] = []

    def handler() -> None:
        with clocked.settle.fenced_transaction(old.ticket) as tx:
            ran.append(True)
            tx.connection.execute("INSERT INTO ledger VALUES ('a', 5)")

    with pytest.raises(LeaseLost):
        handler()
    assert ran == []
    assert ledger_rows(db) == []
    assert work_rows(db) == before


def without_waiting(call: Callable[[], list[Any]]) -> list[Any]:
    """Run ``call`` in another thread; it must return instead of blocking on a row lock."""
    result: list[list[Any]] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(30)  # a liveness guard, far above any real answer time
    assert not worker.is_alive(), "blocked on a locked row instead of skipping it"
    assert len(result) == 1
    return result[0]


def test_a_settled_claim_cannot_open_a_fenced_transaction(
    clocked: PostgresStore, db: Db, ledger: None
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 1, LEASE)
    clocked.settle.settle(
        Settlement(claim.ticket, State.UNKNOWN, "timeout")
    )  # same fence, but no longer claimed
    ran: list[bool] = []

    def handler() -> None:
        with clocked.settle.fenced_transaction(claim.ticket) as tx:
            ran.append(True)
            tx.connection.execute("INSERT INTO ledger VALUES ('a', 5)")

    with pytest.raises(LeaseLost):
        handler()
    assert ran == []
    assert ledger_rows(db) == []


def test_fenced_transaction_holds_the_row_against_takeover_and_sweep(
    clocked: PostgresStore, clock: Clock, db: Db, ledger: None
) -> None:
    clocked.inbox.ingest([delivery("a", max_attempts=2), delivery("b", max_attempts=1)])
    claims = {c.operation_id: c for c in clocked.claims.claim("w1", 2, LEASE)}
    with (
        clocked.settle.fenced_transaction(claims["a"].ticket) as tx_a,
        clocked.settle.fenced_transaction(claims["b"].ticket) as tx_b,
    ):
        clock.advance(LEASE * 2)  # both leases lapse while the handler works
        # Locked rows are skipped, not waited for (a wait here would never end: this thread
        # holds the locks).
        assert without_waiting(lambda: clocked.claims.claim("w2", 10, LEASE)) == []
        assert (
            without_waiting(lambda: clocked.claims.claim_keys("w2", [Key("t1", "a")], LEASE)) == []
        )
        assert without_waiting(clocked.settle.sweep) == Swept([], [])
        tx_a.connection.execute("INSERT INTO ledger VALUES ('a', 5)")
        tx_a.settle()
        tx_b.settle(State.UNKNOWN, "ambiguous")
    assert ledger_rows(db) == [("a", 5)]
    assert db.execute("SELECT operation_id, state, fence FROM work_item ORDER BY 1").fetchall() == [
        ("a", "succeeded", 1),
        ("b", "unknown", 1),
    ]


def test_stale_holder_cannot_write_while_the_new_holder_is_inside_its_transaction(
    clocked: PostgresStore, clock: Clock, db: Db, ledger: None
) -> None:
    """The new holder's class A write commits; the stale holder's never does, nor waits."""
    old, new = taken_over(clocked, clock)
    inside = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def new_holder() -> None:
        try:
            with clocked.settle.fenced_transaction(new.ticket) as tx:
                tx.connection.execute("INSERT INTO ledger VALUES ('a', 2)")
                inside.set()
                assert release.wait(30)
                tx.settle()
        except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
            errors.append(exc)
        finally:
            inside.set()

    worker = threading.Thread(target=new_holder)
    worker.start()
    try:
        assert inside.wait(30)
        with pytest.raises(LeaseLost), clocked.settle.fenced_transaction(old.ticket) as tx:
            tx.connection.execute("INSERT INTO ledger VALUES ('a', 1)")
    finally:
        release.set()
        worker.join(30)
    assert errors == []
    assert ledger_rows(db) == [("a", 2)]
    assert one(db, "a", "state, fence") == ("succeeded", 2)


# -- redrive -----------------------------------------------------------------------------------


@pytest.fixture
def parked(clocked: PostgresStore, clock: Clock) -> dict[Key, Claim]:
    """Rows in every settled state across two tenants and two subscriptions, settled one
    second apart in this order; one row left queued."""
    batch = [
        delivery("u1"),
        delivery("u2", job_type="notify"),
        delivery("q1"),
        delivery("s1"),
        delivery("f1"),
        delivery("u1", tenant="t2"),
        delivery("u3", subscription="notices"),
        delivery("open"),
    ]
    clocked.inbox.ingest(batch)
    claims = {c.key: c for c in clocked.claims.claim("w1", 7, LEASE)}
    assert Key("t1", "open") not in claims
    for key in [d.key for d in batch[:7]]:
        claim = claims[key]
        clock.advance(timedelta(seconds=1))
        kind = key.operation_id[0]
        if kind == "u":
            clocked.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "timeout"))
        elif kind == "q":
            clocked.settle.settle(Settlement(claim.ticket, State.QUARANTINED, "bad_schema"))
        elif kind == "s":
            clocked.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        else:
            clocked.settle.settle(Settlement(claim.ticket, State.FAILED_TERMINAL, "declined"))
    return claims


def audit_rows(db: Db) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT actor, reason, tenant_id, operation_id, from_state, to_state, fence, attempts"
        " FROM redrive_audit ORDER BY tenant_id, operation_id"
    ).fetchall()


def test_redrive_moves_only_parked_rows_matching_the_filter(
    clocked: PostgresStore, clock: Clock, db: Db, parked: dict[Key, Claim]
) -> None:
    moved = clocked.operator.redrive(
        RedriveFilter(tenant_id="t1", subscription="refunds"),
        actor="alice",
        reason="provider confirmed outage",
        extra_attempts=2,
    )
    assert sorted(moved, key=lambda r: r.key.operation_id) == [
        Redriven(Key("t1", "q1"), State.QUARANTINED, 1, 1),
        Redriven(Key("t1", "u1"), State.UNKNOWN, 1, 1),
        Redriven(Key("t1", "u2"), State.UNKNOWN, 1, 1),
    ]
    assert audit_rows(db) == [
        ("alice", "provider confirmed outage", "t1", op, state, "queued", 1, 1)
        for op, state in (("q1", "quarantined"), ("u1", "unknown"), ("u2", "unknown"))
    ]
    rows = db.execute(
        "SELECT tenant_id, operation_id, subscription, state, fence, attempts, max_attempts,"
        " outcome_code, settled_at, next_attempt_at FROM work_item ORDER BY 1, 2, 3"
    ).fetchall()
    by_key = {(r[0], r[1]): r[2:] for r in rows}
    for op in ("q1", "u1", "u2"):
        assert by_key["t1", op] == ("refunds", "queued", 1, 1, 3, None, None, clock())
    assert by_key["t1", "s1"][1] == "succeeded"
    assert by_key["t1", "f1"][1] == "failed_terminal"
    assert by_key["t2", "u1"][1] == "unknown"  # another tenant
    assert by_key["t1", "u3"][1] == "unknown"  # another subscription

    # The next claim has attempts > 1 (reconcile first) and a new fence; the grant is spent
    # after the extra attempts.
    again = {c.operation_id: c for c in clocked.claims.claim("w2", 10, LEASE)}
    assert sorted(again) == ["open", "q1", "u1", "u2"]
    assert {
        (c.fence, c.attempts, c.max_attempts, c.takeover) for op, c in again.items() if op != "open"
    } == {(2, 2, 3, False)}
    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(parked[Key("t1", "u1")].ticket, State.SUCCEEDED, "ok"))


def test_redrive_filters_by_state_job_type_and_keys(
    clocked: PostgresStore, db: Db, parked: dict[Key, Claim]
) -> None:
    only_quarantined = clocked.operator.redrive(
        RedriveFilter(states=(State.QUARANTINED,)), actor="a", reason="r"
    )
    assert [r.key for r in only_quarantined] == [Key("t1", "q1")]
    by_job = clocked.operator.redrive(RedriveFilter(job_type="notify"), actor="a", reason="r")
    assert [r.key for r in by_job] == [Key("t1", "u2")]
    by_keys = clocked.operator.redrive(
        RedriveFilter(keys=(Key("t2", "u1"), Key("t1", "s1"), Key("t1", "nope"))),
        actor="a",
        reason="r",
    )
    assert [r.key for r in by_keys] == [Key("t2", "u1")]
    limited = clocked.operator.redrive(RedriveFilter(limit=1), actor="a", reason="r")
    assert [r.key for r in limited] == [Key("t1", "u1")]  # the oldest parked row first
    assert clocked.operator.redrive(RedriveFilter(), actor="a", reason="r") == [
        Redriven(Key("t1", "u3"), State.UNKNOWN, 1, 1)
    ]
    assert len(audit_rows(db)) == 5
    assert db.execute("SELECT count(*) FROM work_item WHERE state = 'queued'").fetchone() == (6,)


def test_a_redrive_decided_at_a_fence_moves_the_row_only_while_that_fence_holds(
    clocked: PostgresStore, db: Db, parked: dict[Key, Claim]
) -> None:
    key = Key("t1", "u1")
    assert parked[key].fence == 1
    stale = clocked.operator.redrive(
        RedriveFilter(keys=(key,), fences=(2,)), actor="a", reason="decided at another fence"
    )
    assert stale == []
    assert audit_rows(db) == []
    current = clocked.operator.redrive(
        RedriveFilter(keys=(key,), fences=(1,)), actor="a", reason="r"
    )
    assert current == [Redriven(key, State.UNKNOWN, 1, 1)]
    with pytest.raises(ValueError, match="one fence per key"):
        RedriveFilter(keys=(key,), fences=(1, 2))
    with pytest.raises(ValueError, match="one fence per key"):
        RedriveFilter(fences=(1,))


def test_redrive_dry_run_changes_nothing_and_answers_like_a_real_run(
    clocked: PostgresStore, db: Db, parked: dict[Key, Claim]
) -> None:
    before = work_rows(db)
    selection = RedriveFilter(states=(State.UNKNOWN,))
    dry = clocked.operator.redrive(selection, actor="bob", reason="check", dry_run=True)
    assert len(dry) == 4
    assert work_rows(db) == before
    assert audit_rows(db) == []
    real = clocked.operator.redrive(selection, actor="bob", reason="check")
    assert sorted(real, key=repr) == sorted(dry, key=repr)
    assert len(audit_rows(db)) == 4


def test_redrive_refuses_an_unaudited_or_empty_grant(
    clocked: PostgresStore, parked: dict[Key, Claim]
) -> None:
    with pytest.raises(ValueError, match="at least one attempt"):
        clocked.operator.redrive(RedriveFilter(), actor="a", reason="r", extra_attempts=0)
    with pytest.raises(ValueError, match="actor and a reason"):
        clocked.operator.redrive(RedriveFilter(), actor="", reason="r")
    with pytest.raises(ValueError, match="only unknown and quarantined"):
        RedriveFilter(states=(State.SUCCEEDED,))


# -- stats -------------------------------------------------------------------------------------


def test_stats_counts_by_subscription_tenant_and_state(
    clocked: PostgresStore, clock: Clock, parked: dict[Key, Claim]
) -> None:
    clocked.inbox.ingest(
        [
            delivery("live"),
            delivery("stalled", tenant="t2"),
            delivery("s1", payload=b"another payload"),  # a conflict: recorded, not work
            Rejection(subscription="refunds", reason="no tenant", body=b"?"),
        ]
    )
    clock.advance(timedelta(seconds=1))
    claimed = {c.operation_id: c for c in clocked.claims.claim("w9", 10, LEASE)}
    assert sorted(claimed) == ["live", "open", "stalled"]
    clock.advance(LEASE + timedelta(seconds=1))
    clocked.settle.heartbeat(claimed["live"].ticket, LEASE)
    clocked.settle.heartbeat(claimed["open"].ticket, LEASE)
    clock.advance(timedelta(seconds=10))

    stats = clocked.operator.stats()
    counts = set(stats.counts)
    assert counts == {
        StateCount("notices", "t1", State.UNKNOWN, 1),
        StateCount("refunds", "t1", State.CLAIMED, 2),
        StateCount("refunds", "t1", State.FAILED_TERMINAL, 1),
        StateCount("refunds", "t1", State.QUARANTINED, 1),
        StateCount("refunds", "t1", State.SUCCEEDED, 1),
        StateCount("refunds", "t1", State.UNKNOWN, 2),
        StateCount("refunds", "t2", State.CLAIMED, 1),
        StateCount("refunds", "t2", State.UNKNOWN, 1),
    }
    assert stats.total(State.UNKNOWN) == 4
    assert stats.stalled_claims == 1
    # The first unknown was parked at START + 1 s (see ``parked``).
    assert stats.oldest_unknown_seconds == (clock() - START - timedelta(seconds=1)).total_seconds()
    assert stats.rejected == {"conflict": 1, "quarantined": 1}


def test_stats_of_an_empty_store(clocked: PostgresStore) -> None:
    stats = clocked.operator.stats()
    assert stats.counts == ()
    assert stats.stalled_claims == 0
    assert stats.oldest_unknown_seconds is None
    assert stats.rejected == {"conflict": 0, "quarantined": 0}
