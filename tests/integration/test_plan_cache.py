"""The worker tier's statements are planned once per connection, not at every execution.

A prepared statement runs on a generic plan only while that plan costs no more than planning
each execution for its parameters; a parameter the planner cannot size (a row limit, an array
of keys) makes the generic plan look dear, and PostgreSQL then plans the statement again every
time. The claim once paid more to plan (about 1.8 ms) than to run. The bridge's own store
therefore forces one plan per statement (``generic_plans``), in either claim order; the tests
below read, on the store's own connection, that its statements run on that one plan, and that
the plan stays bounded whatever the statistics it was made from said.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

from bridge import sql
from bridge.store import PostgresStore, Settlement
from bridge.store.work import ConcurrencyLimit
from bridge.types import Claim, Decision, Key, State
from tests.support.deliveries import delivery
from tests.support.policy import with_policy
from tests.support.statistics import flushed

LEASE = timedelta(seconds=30)
ROUNDS = 12

#: a queue as large as a busy one, with fresh statistics: a generic plan is costed against it
BACKLOG = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref)
SELECT 'backlog', 'op-' || g, 'orders', 'charge', 'B', sha256(g::text::bytea), 'missing:' || g
  FROM generate_series(1, 20000) AS g
"""

PLANS = """
SELECT regexp_replace(statement, '\\s+', ' ', 'g'), generic_plans, custom_plans
  FROM pg_prepared_statements
"""


@pytest.mark.slow
@pytest.mark.parametrize("fairness", [False, True], ids=["due-order", "tenant-fair"])
def test_claims_settlements_heartbeats_and_ingest_run_on_generic_plans(
    db_url: str, fairness: bool
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(BACKLOG)
        conn.execute("ANALYZE work_item")
    # As the bridge opens its store: one plan per statement, in either claim order (a session
    # that does not force it plans the batch statements for their arrays' sizes instead).
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    if fairness:
        store = with_policy(store, fairness={"t1": 2})
    try:
        for i in range(ROUNDS):
            batch = [delivery(f"r{i}-{j}", tenant=f"t{j % 3}") for j in range(10)]
            store.inbox.ingest(batch)
            store.inbox.ingest(batch)  # replays: the existing rows' hashes are read
            keys = [Key(d.tenant_id, d.operation_id) for d in batch]
            handed = store.claims.claim_keys("w", keys[:5], LEASE)
            store.settle.heartbeat_many([c.ticket for c in handed], LEASE)
            store.inbox.watch(keys)
            store.settle.settle_many([Settlement(c.ticket, State.SUCCEEDED, "ok") for c in handed])
            claimed = store.claims.claim("w", 5, LEASE)
            store.settle.settle_many(
                [
                    Settlement(t, State.SUCCEEDED, "ok")
                    for t in [c.ticket for c in store.claims.claim("w", 5, LEASE)]
                ]
            )
            store.settle.settle_many(
                [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in claimed]]
            )
        with store.pool.connection() as conn:
            plans = conn.execute(PLANS).fetchall()
    finally:
        store.close()
    # psycopg prepares a statement at its fifth execution, and PostgreSQL plans the first five
    # executions of a prepared statement for their parameters before it compares.
    replanned = [text[:60] for text, generic, custom in plans if custom > 5 or not generic]
    assert not replanned, replanned
    # ingest (its batches of replays too), claim_keys, heartbeat_many, watch, settle_many, claim
    assert len(plans) >= 6


def test_a_fair_claim_reads_a_quiet_tenants_row_by_tenant_beside_a_flood_the_statistics_saw_alone(
    db_url: str,
) -> None:
    """The last ANALYZE saw one tenant's 20,000 rows and nothing else; a quiet tenant's row
    written since is read from the index that leads with the tenant (migration 0019), not by
    filtering the flood in claim order."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(BACKLOG)
        conn.execute("ANALYZE work_item")
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    store = with_policy(store, fairness={})
    try:
        store.inbox.ingest([delivery("quiet-1", tenant="quiet")])
        with store.pool.connection() as conn, conn.transaction(force_rollback=True):
            plan = "\n".join(
                str(row[0])
                for row in conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.with_limit("claim_fair", 8),
                    {
                        "worker": "w",
                        "lease": LEASE,
                        "job_types": None,
                        "now": None,
                        "identity_keys": None,
                        "history": 20,
                        "after": "backlog",
                        "weights": None,
                    },
                )
            )
    finally:
        store.close()
    lateral = plan[plan.index("CTE due") : plan.index("CTE claimed")]
    assert "work_item_tenant_due" in lateral, lateral
    assert "Rows Removed by Filter" not in lateral, lateral


#: attempt history, written after the store's plans were made (120 entries per row)
HISTORY = """
INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at, ended_at,
                          outcome, outcome_code)
SELECT w.tenant_id, w.operation_id, 'claim', 1, 'w', now(), now(), 'succeeded', 'ok'
  FROM work_item w, generate_series(1, 120)
"""

#: how often work_attempt was scanned and how many of its rows were read, as far as flushed
HISTORY_READS = """
SELECT seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0)
  FROM pg_stat_user_tables WHERE relname = 'work_attempt'
"""


@pytest.mark.parametrize("fairness", [False, True], ids=["due-order", "tenant-fair"])
def test_a_plan_made_while_the_attempt_history_was_empty_does_not_read_it_afterwards(
    db_url: str, db: psycopg.Connection[tuple[object, ...]], fairness: bool
) -> None:
    """The bridge's connections keep the plan they made first. Made while work_attempt was
    empty, the join that trims a row's history scanned the whole table, at every claim and
    settlement, as the history grew (a claim went from 1.5 to 7 ms over a 20,000-row drain).
    The trim is gated on a row needing it: a claim with no takeover and a settlement of rows
    on their first fence read none of the history, however their plans were made."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    if fairness:
        store = with_policy(store, fairness={})
    with store.pool.connection() as conn:
        # The gate alone, with the scan the planner would take on an empty table allowed (the
        # bridge's sessions also turn sequential scans off: see the test below).
        conn.execute("SET enable_seqscan = on")
    try:
        store.inbox.ingest([delivery(f"op-{i}") for i in range(ROUNDS + 20)])
        db.execute("ANALYZE work_attempt")
        for _ in range(ROUNDS):  # planned, and prepared, while the history is (nearly) empty
            claimed = store.claims.claim("w", 1, LEASE)
            store.settle.settle_many([Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed])
        db.execute(HISTORY)
        before = flushed(store, db, HISTORY_READS)
        claimed = store.claims.claim("w", 10, LEASE)
        stale = store.settle.settle_many(
            [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed]
        )
        after = flushed(store, db, HISTORY_READS)
    finally:
        store.close()
    assert len(claimed) == 10
    assert stale == []
    assert after == before, "the claim or the settlement read work_attempt"


#: sequential scans of work_item, as far as flushed
WORK_ITEM_SCANS = "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'work_item'"

#: rows that arrive after the store's plans were made: 20,000 settled operations
GROWTH = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state)
SELECT 't1', 'old-' || g, 'refunds', 'refund', 'B', sha256(g::text::bytea), 'missing:' || g,
       'succeeded'
  FROM generate_series(1, 20000) AS g
"""


def test_statements_planned_on_an_empty_table_do_not_scan_it_once_it_has_grown(
    db_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A new deployment's connections plan while work_item is empty (its statistics say so
    once anything has analyzed it) and keep those plans. Costed for an empty table, the join of
    a batch's keys to work_item was a scan of the whole table: 20,000 rows later, a round of
    ingest, hand-off claim and settlement of 10 deliveries took 67 ms instead of 6. The
    bridge's connections plan with sequential scans disabled: the rows keep being found by
    index however small the table was when the plans were made."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    db.execute("ANALYZE")  # statistics of the empty tables, as after a first ANALYZE
    made = 0

    def round_of_ten() -> int:
        nonlocal made
        batch = [delivery(f"op-{made + i}") for i in range(10)]
        made += len(batch)
        store.inbox.ingest(batch)
        keys = [Key(d.tenant_id, d.operation_id) for d in batch]
        claimed = store.claims.claim_keys("w", keys, LEASE)
        store.settle.settle_many([Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed])
        return len(claimed)

    try:
        for _ in range(ROUNDS):  # planned, and prepared, on an empty table
            assert round_of_ten() == 10
        db.execute(GROWTH)
        before = flushed(store, db, WORK_ITEM_SCANS)
        assert round_of_ten() == 10
        after = flushed(store, db, WORK_ITEM_SCANS)
    finally:
        store.close()
    assert after == before, "a statement scanned work_item whole"


#: index entries read from work_item's indexes, as far as flushed
WORK_ITEM_ENTRIES = "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'work_item'"

#: open rows of the same tenant that arrive after the store's plans were made
OPEN_GROWTH = GROWTH.replace("'succeeded'", "'queued'")


def test_a_hand_off_claim_planned_on_an_empty_table_finds_each_key_alone(
    db_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Planned while work_item was empty, a hand-off claim of a few keys cost what reading the
    partial indexes of open rows costs: 20,000 open rows of the tenant later, a claim of 8 keys
    read every entry of those indexes (40 ms, the pool's whole round). Each key is looked up
    alone, by the primary key: a claim of ten keys reads tens of entries."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    db.execute("ANALYZE")  # statistics of the empty tables, as after a first ANALYZE
    made = 0

    def round_of_ten(between: Callable[[], object] = lambda: None) -> int:
        nonlocal made
        batch = [delivery(f"op-{made + i}") for i in range(10)]
        made += len(batch)
        store.inbox.ingest(batch)
        keys = [Key(d.tenant_id, d.operation_id) for d in batch]
        between()
        claimed = store.claims.claim_keys("w", keys, LEASE)
        between()
        store.settle.settle_many([Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed])
        return len(claimed)

    reads: list[int] = []

    def entries() -> None:
        reads.append(int(str(flushed(store, db, WORK_ITEM_ENTRIES)[0] or 0)))

    try:
        for _ in range(ROUNDS):  # planned, and prepared, on an empty table
            assert round_of_ten() == 10
        db.execute(OPEN_GROWTH)
        assert round_of_ten(entries) == 10
    finally:
        store.close()
    claim = reads[1] - reads[0]
    assert claim < 100, f"a hand-off claim of ten keys read {claim} index entries"


def test_a_batch_of_redeliveries_planned_on_an_empty_table_reads_each_key_alone(
    db_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The inbox's one statement for a batch that holds keys that existed locks each replayed
    row before it appends its copies. Planned while work_item was empty, that lock was a join
    that read the whole primary key, every batch (20,000 rows later, 20,000 entries for two
    replays). Each row is looked up alone: a batch of ten reads tens of entries."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    db.execute("ANALYZE")  # statistics of the empty tables, as after a first ANALYZE
    made = 0

    def batch_with_replays() -> list[Decision]:
        nonlocal made
        batch = [delivery(f"op-{made + i}") for i in range(8)]
        again = [delivery(f"op-{made - 10}"), delivery(f"op-{made - 9}")] if made else []
        made += 10
        return [r.decision for r in store.inbox.ingest([*batch, *again])]

    try:
        for _ in range(ROUNDS):  # planned, and prepared, on an empty table
            batch_with_replays()
        db.execute(GROWTH)
        before = int(str(flushed(store, db, WORK_ITEM_ENTRIES)[0] or 0))
        decided = batch_with_replays()
        after = int(str(flushed(store, db, WORK_ITEM_ENTRIES)[0] or 0))
    finally:
        store.close()
    assert decided == [Decision.NEW] * 8 + [Decision.REPLAY] * 2
    assert after - before < 100, f"a batch of ten read {after - before} index entries"


#: the open rows a drained table's statistics never saw: 4,000 queued rows of the tenant, and
#: 2,000 more claimed by other workers with leases that hold
OPEN_ROWS = 6000
OPEN_SINCE = f"""
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, claim_order)
SELECT 't1', 'open-' || g, 'refunds', 'refund', 'B', sha256(g::text::bytea), 'missing:' || g,
       now() + interval '1 hour'
  FROM generate_series(1, {OPEN_ROWS}) AS g;
UPDATE work_item
   SET state = 'claimed', fence = 1, attempts = 1, lease_owner = 'other',
       lease_expires_at = now() + interval '1 hour', claimed_at = now()
 WHERE operation_id LIKE 'open-%' AND substr(operation_id, 6)::int <= 2000
"""


@pytest.mark.parametrize("fairness", [False, True], ids=["due-order", "tenant-fair"])
def test_plans_made_from_a_drained_tables_statistics_read_only_the_rows_they_move(
    db_url: str, db: psycopg.Connection[tuple[object, ...]], fairness: bool
) -> None:
    """ANALYZE ran while every row was terminal (a queue that had drained); the store's plans
    were made from those statistics. The planner then took any partial index of open rows for
    empty: the fenced writes (a heartbeat, a settlement) read every open row of the tenant to
    find the one they name, and a claim read and sorted the whole backlog; 4,000 queued and
    2,000 claimed rows later, a claim of 10 took 10.9 ms instead of 1.1 (migration 0020). Each
    statement of a round reads the entries of the rows it moves (and of the rounds' own rows,
    dead until a vacuum), not the thousands of open rows."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    if fairness:
        store = with_policy(store, fairness={})
    db.execute(GROWTH)
    db.execute("ANALYZE work_item")  # every row terminal
    made = 0
    reads: dict[str, int] = {}

    def read(step: str, action: Callable[[], object]) -> None:
        before = int(str(flushed(store, db, WORK_ITEM_ENTRIES)[0] or 0))
        action()
        reads[step] = int(str(flushed(store, db, WORK_ITEM_ENTRIES)[0] or 0)) - before

    def round_of_ten(measure: bool) -> int:
        nonlocal made
        batch = [delivery(f"op-{made + i}") for i in range(10)]
        made += len(batch)
        store.inbox.ingest(batch)
        steps: dict[str, Callable[[], object]] = {}
        claimed: list[Claim] = []
        steps["claim"] = lambda: claimed.extend(store.claims.claim("w", 10, LEASE))
        steps["heartbeat_many"] = lambda: store.settle.heartbeat_many(
            [c.ticket for c in claimed], LEASE
        )
        steps["heartbeat"] = lambda: store.settle.heartbeat(claimed[0].ticket, LEASE)
        steps["settle_many"] = lambda: store.settle.settle_many(
            [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed]
        )
        for step, action in steps.items():
            if measure:
                read(step, action)
            else:
                action()
        return len(claimed)

    try:
        for _ in range(ROUNDS):  # planned, and prepared, from the drained table's statistics
            assert round_of_ten(measure=False) == 10
        db.execute(OPEN_SINCE)
        assert round_of_ten(measure=True) == 10
    finally:
        store.close()
    # Bounded by the rounds' own rows (120 settled since the last vacuum, whose dead entries a
    # claim may pass over), not by the 6,000 open rows the statistics never saw.
    wide = {step: n for step, n in reads.items() if n >= OPEN_ROWS // 10}
    assert not wide, f"index entries read per statement: {reads}"


#: rows of work_item read by scans and index entries, as far as flushed
WORK_ITEM_READS = """
SELECT seq_tup_read + coalesce(idx_tup_fetch, 0)
       + (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
           WHERE relname = 'work_item')
  FROM pg_stat_user_tables WHERE relname = 'work_item'
"""


def test_the_statements_that_count_claimed_rows_read_those_rows_not_the_table(
    db_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A concurrency-limited claim counts the claimed rows of its job types (migration 0011's
    fencebridge_concurrency_room), as do `status`'s waiting counts and the identity key
    checks. Claimed rows are exactly the rows with a lease: read through work_item_lease,
    each reads the rows in flight, not the 20,000 settled rows beside them."""
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    store = with_policy(store, concurrency={"refund": ConcurrencyLimit(total=50, per_tenant=20)})
    db.execute(GROWTH)
    db.execute("ANALYZE work_item")
    reads: dict[str, int] = {}

    def read(step: str, action: Callable[[], object]) -> None:
        before = int(str(flushed(store, db, WORK_ITEM_READS)[0] or 0))
        action()
        reads[step] = int(str(flushed(store, db, WORK_ITEM_READS)[0] or 0)) - before

    try:
        for i in range(ROUNDS):  # planned, and prepared
            store.inbox.ingest([delivery(f"op-{i}-{j}") for j in range(5)])
            claimed = store.claims.claim("w", 3, LEASE)
            assert len(claimed) == 3
            store.settle.settle_many(
                [Settlement(c.ticket, State.SUCCEEDED, "ok") for c in claimed[1:]]
            )
        read("limited claim", lambda: store.claims.claim("w", 3, LEASE))
        read("waiting", store.operator.waiting)

        def open_rows() -> object:
            with store.pool.connection() as conn:
                return conn.execute(sql.statement("identity_open_rows"), {"held": [1]}).fetchall()

        read("identity open rows", open_rows)
    finally:
        store.close()
    wide = {step: n for step, n in reads.items() if n >= 1000}
    assert not wide, f"work_item rows and index entries read: {reads}"
