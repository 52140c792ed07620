"""The whole protocol against a small in-memory model, step by step (hypothesis stateful).

The model is the protocol written out plainly: which rows a claim may take, which fence is
current, what each settlement does. After every step the full table must equal the model.
Time is the store's injected clock, so leases expire exactly when the model says they do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bridge.errors import LeaseLost
from bridge.store import PostgresStore, Settlement
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    Key,
    RedriveFilter,
    Redriven,
    Rejection,
    State,
    StateCount,
    TargetClass,
    Ticket,
    payload_digest,
)

Db = psycopg.Connection[tuple[Any, ...]]

START = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
TENANTS = ("t1", "t2")
OPERATIONS = ("op-1", "op-2", "op-3")  # the same ids in both tenants, on purpose
KEYS = [Key(t, o) for t in TENANTS for o in OPERATIONS]
SUBSCRIPTION = "refunds"
SWEPT = "lease_expired_attempts_exhausted"
SWEPT_DETAIL = object()  # the sweeper's own wording: any text
BATCHES = st.lists(
    st.tuples(st.sampled_from(KEYS), st.sampled_from("ab"), st.sampled_from([1, 2, 2, 3])),
    min_size=1,
    max_size=4,
)
# Claims often come a while after the last step, so leases lapse and rows are taken over.
WAITS = st.sampled_from([timedelta(0), timedelta(0), timedelta(seconds=11), timedelta(seconds=31)])
SETTLE_STATES = (State.SUCCEEDED, State.FAILED_TERMINAL, State.UNKNOWN, State.QUARANTINED)


def job_type(key: Key) -> str:
    return "notify" if key.operation_id == "op-3" else "refund"


def payload(key: Key, variant: str) -> bytes:
    # The payload does not name the tenant: colliding ids carry identical bytes.
    return f"{key.operation_id}:{variant}".encode()


@dataclass
class Row:
    """One work row as the protocol says it must be."""

    key: Key
    variant: str
    max_attempts: int
    seq: int
    next_attempt_at: datetime
    state: State = State.QUEUED
    fence: int = 0
    attempts: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    outcome_code: str | None = None
    outcome_detail: str | object | None = None
    intent_fence: int | None = None
    settled_at: datetime | None = None

    def holds(self, ticket: Ticket) -> bool:
        """Whether a write under ``ticket`` must be accepted."""
        return self.state is State.CLAIMED and self.fence == ticket.fence

    def release(self) -> None:
        # The lease ends; the row keeps its last owner, which the attempt's record names.
        self.lease_expires_at = None


@dataclass
class Model:
    now: datetime = START
    rows: dict[Key, Row] = field(default_factory=dict)
    next_seq: int = 0
    conflicts: int = 0
    quarantined_deliveries: int = 0
    audits: int = 0

    def expired(self, row: Row) -> bool:
        return (
            row.state is State.CLAIMED
            and row.lease_expires_at is not None
            and row.lease_expires_at < self.now
        )

    def due(self, row: Row) -> bool:
        return row.state is State.QUEUED and row.next_attempt_at <= self.now

    def any_in(self, *states: State) -> bool:
        return any(r.state in states for r in self.rows.values())

    def waiting(self) -> bool:
        """Whether time passing can change anything: a lease or a backoff is running."""
        return any(
            r.state is State.CLAIMED or (r.state is State.QUEUED and r.next_attempt_at > self.now)
            for r in self.rows.values()
        )

    def claimable(self, row: Row) -> bool:
        return self.due(row) or (self.expired(row) and row.attempts < row.max_attempts)

    def claim(self, row: Row, worker: str, lease: timedelta) -> None:
        row.state = State.CLAIMED
        row.fence += 1
        row.attempts += 1
        row.lease_owner = worker
        row.lease_expires_at = self.now + lease

    def settle(self, row: Row, state: State, code: str, detail: str | None) -> None:
        row.state = state
        row.outcome_code = code
        row.outcome_detail = detail
        row.settled_at = self.now
        row.release()


@dataclass(frozen=True)
class Context:
    store: PostgresStore
    db: Db


class ProtocolMachine(RuleBasedStateMachine):
    context: ClassVar[Context | None] = None

    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        assert self.context is not None
        self.db = self.context.db
        self.db.execute(
            "TRUNCATE work_item, work_attempt, delivery_copy, payload, rejected_delivery, "
            "redrive_audit RESTART IDENTITY"
        )
        self.model = Model()
        self.store = PostgresStore(self.context.store.pool, clock=lambda: self.model.now)

    # -- inbox -----------------------------------------------------------------------------

    @initialize(items=BATCHES, rejection=st.booleans())
    def first_batch(self, items: list[tuple[Key, str, int]], rejection: bool) -> None:
        """Every run starts from an empty table and one received batch."""
        assert self.db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)
        self.ingest(items, rejection)

    @rule(items=BATCHES, rejection=st.booleans())
    def ingest(self, items: list[tuple[Key, str, int]], rejection: bool) -> None:
        m = self.model
        batch: list[Delivery | Rejection] = [
            Delivery(
                tenant_id=key.tenant_id,
                operation_id=key.operation_id,
                subscription=SUBSCRIPTION,
                job_type=job_type(key),
                target_class=TargetClass.A,
                payload=payload(key, variant),
                max_attempts=max_attempts,
            )
            for key, variant, max_attempts in items
        ]
        if rejection:
            batch.insert(len(batch) // 2, Rejection(subscription=SUBSCRIPTION, reason="garbled"))

        expected: list[IngestResult] = []
        for item in batch:
            if isinstance(item, Rejection):
                expected.append(IngestResult(Decision.QUARANTINED, None))
                m.quarantined_deliveries += 1
                continue
            key, variant = item.key, item.payload.decode().split(":")[1]
            row = m.rows.get(key)
            if row is None:
                m.rows[key] = Row(key, variant, item.max_attempts, m.next_seq, m.now)
                m.next_seq += 1
                expected.append(IngestResult(Decision.NEW, key, State.QUEUED))
            elif row.variant == variant:
                expected.append(IngestResult(Decision.REPLAY, key, row.state))
            else:
                event("conflict")
                m.conflicts += 1
                expected.append(IngestResult(Decision.CONFLICT, key, row.state))
        assert self.store.inbox.ingest(batch) == expected

    # -- claims ----------------------------------------------------------------------------

    @rule(
        target=tickets,
        worker=st.sampled_from(["w1", "w2"]),
        limit=st.integers(min_value=1, max_value=4),
        job_types=st.sampled_from([None, ["refund"], ["notify"], ["refund", "notify"], []]),
        lease=st.sampled_from([timedelta(seconds=10), timedelta(seconds=30)]),
        wait=WAITS,
    )
    def claim(
        self,
        worker: str,
        limit: int,
        job_types: list[str] | None,
        lease: timedelta,
        wait: timedelta,
    ) -> Any:
        m = self.model
        m.now += wait
        wanted = [r for r in m.rows.values() if job_types is None or job_type(r.key) in job_types]
        expired = sorted(
            (r for r in wanted if m.expired(r) and r.attempts < r.max_attempts),
            key=lambda r: r.lease_expires_at or START,
        )
        due = sorted((r for r in wanted if m.due(r)), key=lambda r: (r.next_attempt_at, r.seq))
        takeovers = min(limit, len(expired))
        fresh = due[: min(limit - takeovers, len(due))]

        claims = self.store.claims.claim(worker, limit, lease, job_types=job_types)

        taken = [c for c in claims if c.takeover]
        assert len(taken) == takeovers
        if takeovers:
            event("claim took over an expired lease")
            # The longest-expired leases go first; among equal expiries, any.
            last = expired[takeovers - 1].lease_expires_at
            assert last is not None
            must = {r.key for r in expired if r.lease_expires_at and r.lease_expires_at < last}
            may = {r.key for r in expired if r.lease_expires_at and r.lease_expires_at <= last}
            assert must <= {c.key for c in taken} <= may
        assert sorted((c.key for c in claims if not c.takeover), key=repr) == sorted(
            (r.key for r in fresh), key=repr
        )
        return multiple(*self.apply_claims(claims, worker, lease))

    @rule(
        target=tickets,
        keys=st.lists(st.sampled_from(KEYS), max_size=4),
        worker=st.sampled_from(["w1", "w2"]),
        wait=WAITS,
    )
    def claim_keys(self, keys: list[Key], worker: str, wait: timedelta) -> Any:
        m = self.model
        m.now += wait
        lease = timedelta(seconds=30)
        expected = {k for k in keys if k in m.rows and m.claimable(m.rows[k])}
        takeovers = {k for k in expected if m.rows[k].state is State.CLAIMED}
        claims = self.store.claims.claim_keys(worker, keys, lease)
        assert {c.key for c in claims if c.takeover} == takeovers
        assert {c.key for c in claims} == expected
        assert len(claims) == len(expected)
        return multiple(*self.apply_claims(claims, worker, lease))

    def apply_claims(self, claims: list[Claim], worker: str, lease: timedelta) -> list[Ticket]:
        m = self.model
        for c in claims:
            row = m.rows[c.key]
            m.claim(row, worker, lease)
            assert (c.fence, c.attempts, c.max_attempts) == (
                row.fence,
                row.attempts,
                row.max_attempts,
            )
            assert c.lease_expires_at == row.lease_expires_at
            assert c.intent_fence == row.intent_fence
            assert c.payload == payload(c.key, row.variant)
            assert c.payload_hash == payload_digest(payload(c.key, row.variant))
            assert c.job_type == job_type(c.key)
        return [c.ticket for c in claims]

    @rule(target=tickets, key=st.sampled_from(KEYS), ahead=st.integers(min_value=-1, max_value=2))
    def forge_ticket(self, key: Key, ahead: int) -> Ticket:
        """A ticket nobody was given: an older, the current or a future fence number."""
        row = self.model.rows.get(key)
        return Ticket(key.tenant_id, key.operation_id, max(0, (row.fence if row else 0) + ahead))

    # -- fenced writes ---------------------------------------------------------------------

    @rule(ticket=tickets, lease=st.sampled_from([timedelta(seconds=5), timedelta(seconds=30)]))
    def heartbeat(self, ticket: Ticket, lease: timedelta) -> None:
        row = self.model.rows.get(ticket.key)
        if row is not None and row.holds(ticket):
            row.lease_expires_at = self.model.now + lease
            assert self.store.settle.heartbeat(ticket, lease) == row.lease_expires_at
        else:
            with pytest.raises(LeaseLost):
                self.store.settle.heartbeat(ticket, lease)

    @rule(tickets=st.lists(tickets, max_size=4))
    def heartbeat_many(self, tickets: list[Ticket]) -> None:
        lease = timedelta(seconds=20)
        stale = [t for t in tickets if not self.held(t)]
        for t in tickets:
            if self.held(t):
                self.model.rows[t.key].lease_expires_at = self.model.now + lease
        assert self.store.settle.heartbeat_many(tickets, lease) == stale

    def held(self, ticket: Ticket) -> bool:
        row = self.model.rows.get(ticket.key)
        return row is not None and row.holds(ticket)

    @rule(ticket=tickets, state=st.sampled_from(SETTLE_STATES))
    def settle(self, ticket: Ticket, state: State) -> None:
        def method(ticket: Ticket, code: str, detail: str) -> None:
            self.store.settle.settle(Settlement(ticket, state, code, detail))

        code, detail = f"{state.value}-code", f"fence {ticket.fence}"
        if self.held(ticket):
            self.model.settle(self.model.rows[ticket.key], state, code, detail)
            method(ticket, code, detail)
        else:
            event("stale settlement refused")
            with pytest.raises(LeaseLost):
                method(ticket, code, detail)

    def current(self, pick: int) -> Ticket | None:
        """The ticket of one row that is claimed right now (by the model), if any."""
        held = sorted(
            (r for r in self.model.rows.values() if r.state is State.CLAIMED),
            key=lambda r: r.seq,
        )
        if not held:
            return None
        row = held[pick % len(held)]
        return Ticket(row.key.tenant_id, row.key.operation_id, row.fence)

    @precondition(lambda self: self.model.any_in(State.CLAIMED))
    @rule(pick=st.integers(min_value=0, max_value=5), state=st.sampled_from(SETTLE_STATES))
    def settle_current(self, pick: int, state: State) -> None:
        """The holder settles (stale tickets come from the bundle far more often)."""
        ticket = self.current(pick)
        assert ticket is not None
        self.settle(ticket, state)

    @precondition(lambda self: self.model.any_in(State.CLAIMED))
    @rule(
        pick=st.integers(min_value=0, max_value=5),
        backoff=st.sampled_from([timedelta(0), timedelta(seconds=5), timedelta(seconds=60)]),
    )
    def retry_current(self, pick: int, backoff: timedelta) -> None:
        ticket = self.current(pick)
        assert ticket is not None
        self.retry_later(ticket, backoff)

    @rule(
        settlements=st.lists(
            st.tuples(tickets, st.sampled_from(SETTLE_STATES)),
            max_size=4,
            unique_by=lambda s: s[0],
        )
    )
    def settle_many(self, settlements: list[tuple[Ticket, State]]) -> None:
        stale = [t for t, _ in settlements if not self.held(t)]
        batch = [Settlement(t, s, "batch", None) for t, s in settlements]
        for t, s in settlements:
            if self.held(t):
                self.model.settle(self.model.rows[t.key], s, "batch", None)
        assert self.store.settle.settle_many(batch) == stale

    @rule(tickets=st.lists(tickets, max_size=3, unique=True))
    def complete_many(self, tickets: list[Ticket]) -> None:
        stale = [t for t in tickets if not self.held(t)]
        for t in tickets:
            if self.held(t):
                self.model.settle(self.model.rows[t.key], State.SUCCEEDED, "ok", None)
        assert (
            self.store.settle.settle_many([Settlement(t, State.SUCCEEDED, "ok") for t in tickets])
            == stale
        )

    @rule(
        ticket=tickets,
        backoff=st.sampled_from([timedelta(0), timedelta(seconds=5), timedelta(seconds=60)]),
    )
    def retry_later(self, ticket: Ticket, backoff: timedelta) -> None:
        m = self.model
        if not self.held(ticket):
            with pytest.raises(LeaseLost):
                self.store.settle.retry_later(ticket, backoff, "retry")
            return
        row = m.rows[ticket.key]
        row.next_attempt_at = m.now + backoff
        row.outcome_detail = None
        row.release()
        if row.attempts >= row.max_attempts:
            event("retry with no attempt left")
            row.state, row.outcome_code, row.settled_at = (
                State.FAILED_TERMINAL,
                "attempts_exhausted",
                m.now,
            )
        else:
            row.state, row.outcome_code, row.settled_at = State.QUEUED, "retry", None
        assert self.store.settle.retry_later(ticket, backoff, "retry") is row.state

    @rule(ticket=tickets)
    def record_intent(self, ticket: Ticket) -> None:
        if self.held(ticket):
            self.model.rows[ticket.key].intent_fence = ticket.fence
            self.store.settle.record_intent(ticket)
        else:
            with pytest.raises(LeaseLost):
                self.store.settle.record_intent(ticket)

    # -- time and maintenance --------------------------------------------------------------

    @precondition(lambda self: self.model.waiting())
    @rule(seconds=st.sampled_from([1, 5, 10, 29, 30, 31, 61]))
    def advance_time(self, seconds: int) -> None:
        self.model.now += timedelta(seconds=seconds)

    @precondition(lambda self: any(self.model.expired(r) for r in self.model.rows.values()))
    @rule(limit=st.sampled_from([1, 1000]))
    def sweep(self, limit: int) -> None:
        m = self.model
        candidates = sorted(
            (r for r in m.rows.values() if m.expired(r) and r.attempts >= r.max_attempts),
            key=lambda r: r.lease_expires_at or START,
        )
        swept = self.store.settle.sweep(limit).parked
        assert len(swept) == min(limit, len(candidates))
        if swept:
            event("sweep parked a row")
        for t in swept:
            row = m.rows[t.key]
            assert row in candidates
            assert t.fence == row.fence
            m.settle(row, State.UNKNOWN, SWEPT, None)
            row.outcome_detail = SWEPT_DETAIL

    @precondition(lambda self: self.model.any_in(State.UNKNOWN, State.QUARANTINED))
    @rule(
        tenant=st.sampled_from([None, *TENANTS]),
        states=st.sampled_from(
            [(State.UNKNOWN,), (State.QUARANTINED,), (State.UNKNOWN, State.QUARANTINED)]
        ),
        keys=st.none() | st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
        extra=st.integers(min_value=1, max_value=2),
        dry_run=st.booleans(),
    )
    def redrive(
        self,
        tenant: str | None,
        states: tuple[State, ...],
        keys: list[Key] | None,
        extra: int,
        dry_run: bool,
    ) -> None:
        m = self.model
        selection = RedriveFilter(
            states=states, tenant_id=tenant, keys=tuple(keys) if keys is not None else None
        )
        picked = [
            r
            for r in m.rows.values()
            if r.state in states
            and (tenant is None or r.key.tenant_id == tenant)
            and (keys is None or r.key in keys)
        ]
        expected = sorted((Redriven(r.key, r.state, r.fence, r.attempts) for r in picked), key=repr)
        moved = self.store.operator.redrive(
            selection, actor="model", reason="test", extra_attempts=extra, dry_run=dry_run
        )
        assert sorted(moved, key=repr) == expected
        if moved:
            event(f"redrive moved rows (dry run: {dry_run})")
        if dry_run:
            return
        m.audits += len(picked)
        for r in picked:
            r.state = State.QUEUED
            r.max_attempts = r.attempts + extra
            r.next_attempt_at = m.now
            r.outcome_code = r.outcome_detail = r.settled_at = None

    @invariant()
    def stats_match_model(self) -> None:
        m = self.model
        stats = self.store.operator.stats()
        counts: dict[tuple[str, State], int] = {}
        for r in m.rows.values():
            counts[r.key.tenant_id, r.state] = counts.get((r.key.tenant_id, r.state), 0) + 1
        assert set(stats.counts) == {
            StateCount(SUBSCRIPTION, tenant, state, n) for (tenant, state), n in counts.items()
        }
        assert stats.stalled_claims == sum(1 for r in m.rows.values() if m.expired(r))
        unknown = [r.settled_at for r in m.rows.values() if r.state is State.UNKNOWN]
        oldest = min((s for s in unknown if s is not None), default=None)
        assert stats.oldest_unknown_seconds == (
            (m.now - oldest).total_seconds() if oldest is not None else None
        )
        assert stats.rejected == {
            "conflict": m.conflicts,
            "quarantined": m.quarantined_deliveries,
        }

    # -- the table equals the model --------------------------------------------------------

    @invariant()
    def table_matches_model(self) -> None:
        found = self.db.execute(
            "SELECT tenant_id, operation_id, state, fence, attempts, max_attempts, lease_owner,"
            " lease_expires_at, next_attempt_at, outcome_code, outcome_detail, intent_fence,"
            " settled_at, payload_hash, job_type"
            " FROM work_item"
        ).fetchall()
        table = {Key(r[0], r[1]): r[2:] for r in found}
        assert set(table) == set(self.model.rows)
        for key, row in self.model.rows.items():
            (
                state,
                fence,
                attempts,
                max_attempts,
                owner,
                expires,
                next_at,
                code,
                detail,
                intent,
                settled_at,
                digest,
                job,
            ) = table[key]
            actual = replace(
                row,
                state=State(state),
                fence=fence,
                attempts=attempts,
                max_attempts=max_attempts,
                lease_owner=owner,
                lease_expires_at=expires,
                next_attempt_at=next_at,
                outcome_code=code,
                outcome_detail=SWEPT_DETAIL if row.outcome_detail is SWEPT_DETAIL else detail,
                intent_fence=intent,
                settled_at=settled_at,
            )
            assert actual == row, key
            assert bytes(digest) == payload_digest(payload(key, row.variant))
            assert job == job_type(key)
            if row.outcome_detail is SWEPT_DETAIL:
                assert isinstance(detail, str)
                assert detail

    @invariant()
    def side_tables_match_model(self) -> None:
        counts = self.db.execute(
            "SELECT (SELECT count(*) FROM rejected_delivery WHERE kind = 'conflict'),"
            " (SELECT count(*) FROM rejected_delivery WHERE kind = 'quarantined'),"
            " (SELECT count(*) FROM redrive_audit)"
        ).fetchone()
        m = self.model
        assert counts == (m.conflicts, m.quarantined_deliveries, m.audits)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a failure is shrunk against the database, which takes a while
def test_the_store_never_disagrees_with_the_protocol_model(
    store: PostgresStore, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ProtocolMachine, "context", Context(store, db))
    run_state_machine_as_test(
        ProtocolMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
