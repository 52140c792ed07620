"""Claims: one statement, fence + 1, lease from the store's clock, only claimable rows."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge import sql
from bridge.errors import LeaseLost
from bridge.store import PostgresStore
from bridge.store.work import ATTEMPT_HISTORY_DEFAULT, Settlement
from bridge.types import Claim, Key, State
from tests.support.clock import EPOCH as START
from tests.support.clock import Clock
from tests.support.deliveries import delivery

LEASE = timedelta(seconds=30)

Db = psycopg.Connection[tuple[Any, ...]]


def row(db: Db, op: str, tenant: str = "t1") -> tuple[Any, ...]:
    found = db.execute(
        "SELECT state, fence, attempts, lease_owner, lease_expires_at, outcome_code"
        " FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (tenant, op),
    ).fetchone()
    assert found is not None
    return found


def ops(claims: list[Claim]) -> list[str]:
    return [c.operation_id for c in claims]


def test_claim_bumps_fence_and_attempts_and_leases_from_the_store_clock(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (claim,) = clocked.claims.claim("w1", 10, LEASE)
    assert (claim.key, claim.fence, claim.attempts, claim.takeover) == (Key("t1", "a"), 1, 1, False)
    assert claim.lease_expires_at == START + LEASE
    assert claim.payload == b'{"op": "a"}'
    assert row(db, "a") == ("claimed", 1, 1, "w1", START + LEASE, None)
    assert clocked.claims.claim("w2", 10, LEASE) == []


def test_ingest_uses_the_store_clock_so_rows_are_due_at_once(
    clocked: PostgresStore, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    due = db.execute("SELECT next_attempt_at, created_at FROM work_item").fetchone()
    assert due == (START, START)
    assert ops(clocked.claims.claim("w1", 1, LEASE)) == ["a"]


def test_claim_takes_at_most_limit_rows_in_ingest_order(clocked: PostgresStore) -> None:
    clocked.inbox.ingest([delivery(op) for op in ("e", "d", "c", "b", "a")])
    assert sorted(ops(clocked.claims.claim("w1", 2, LEASE))) == ["d", "e"]
    assert sorted(ops(clocked.claims.claim("w1", 2, LEASE))) == ["b", "c"]
    assert ops(clocked.claims.claim("w1", 2, LEASE)) == ["a"]
    assert clocked.claims.claim("w1", 2, LEASE) == []


def test_live_lease_is_not_claimable(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery("a")])
    clocked.claims.claim("w1", 1, LEASE)
    clock.advance(LEASE)  # expiry is exclusive: a lease that ends now is still held
    assert clocked.claims.claim("w2", 1, LEASE) == []
    assert clocked.claims.claim_keys("w2", [Key("t1", "a")], LEASE) == []


def test_expired_claim_with_attempts_left_is_taken_over(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (first,) = clocked.claims.claim("w1", 1, LEASE)
    clock.advance(LEASE + timedelta(seconds=1))
    (second,) = clocked.claims.claim("w2", 1, LEASE)
    assert (second.fence, second.attempts, second.takeover) == (2, 2, True)
    assert second.lease_expires_at == clock() + LEASE
    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(first.ticket, State.SUCCEEDED, "ok"))
    with pytest.raises(LeaseLost):
        clocked.settle.heartbeat(first.ticket, LEASE)
    assert row(db, "a") == ("claimed", 2, 2, "w2", clock() + LEASE, None)
    clocked.settle.settle(Settlement(second.ticket, State.SUCCEEDED, "ok"))
    assert row(db, "a")[:3] == ("succeeded", 2, 2)


def test_takeovers_come_first_longest_expired_first(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery(op) for op in ("a", "b", "c")])
    held = {c.operation_id: c.ticket for c in clocked.claims.claim("w1", 3, LEASE)}
    clock.advance(timedelta(seconds=10))
    clocked.settle.heartbeat(held["a"], LEASE)  # a now expires 10 s after c
    clock.advance(timedelta(seconds=5))
    clocked.settle.heartbeat(held["b"], LEASE)  # b 15 s after c
    clocked.inbox.ingest([delivery("queued")])
    clock.advance(LEASE * 2)
    order = [
        (claim.operation_id, claim.takeover)
        for _ in range(4)
        for claim in clocked.claims.claim("w2", 1, LEASE)
    ]
    assert order == [("c", True), ("a", True), ("b", True), ("queued", False)]


def test_takeover_by_claim_keys_is_marked_as_takeover(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery("a")])
    clocked.claims.claim("w1", 1, LEASE)
    clock.advance(LEASE * 2)
    (claim,) = clocked.claims.claim_keys("w2", [Key("t1", "a")], LEASE)
    assert (claim.fence, claim.attempts, claim.takeover) == (2, 2, True)


def test_expired_claim_with_attempts_exhausted_is_not_claimable(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a", max_attempts=1)])
    clocked.claims.claim("w1", 1, LEASE)
    clock.advance(LEASE * 2)
    assert clocked.claims.claim("w2", 10, LEASE) == []
    assert clocked.claims.claim_keys("w2", [Key("t1", "a")], LEASE) == []
    assert row(db, "a")[:4] == ("claimed", 1, 1, "w1")


def test_claim_respects_job_types(clocked: PostgresStore) -> None:
    clocked.inbox.ingest(
        [delivery("r1"), delivery("n1", job_type="notify"), delivery("m1", job_type="mail")]
    )
    assert ops(clocked.claims.claim("w", 10, LEASE, job_types=["notify"])) == ["n1"]
    assert clocked.claims.claim("w", 10, LEASE, job_types=["notify"]) == []
    assert clocked.claims.claim("w", 10, LEASE, job_types=[]) == []
    assert sorted(ops(clocked.claims.claim("w", 10, LEASE, job_types=["refund", "mail"]))) == [
        "m1",
        "r1",
    ]


def test_claim_respects_job_types_for_takeovers(clocked: PostgresStore, clock: Clock) -> None:
    clocked.inbox.ingest([delivery("r1"), delivery("n1", job_type="notify")])
    clocked.claims.claim("w1", 10, LEASE)
    clock.advance(LEASE * 2)
    (claim,) = clocked.claims.claim("w2", 10, LEASE, job_types=["notify"])
    assert (claim.operation_id, claim.takeover) == ("n1", True)


def test_claim_keys_claims_only_the_given_claimable_keys(clocked: PostgresStore, db: Db) -> None:
    clocked.inbox.ingest([delivery(op) for op in ("queued", "held", "done", "later", "other")])
    earlier = clocked.claims.claim_keys(
        "w0", [Key("t1", "held"), Key("t1", "done"), Key("t1", "later")], LEASE
    )
    tickets = {c.operation_id: c.ticket for c in earlier}
    assert sorted(tickets) == ["done", "held", "later"]
    clocked.settle.settle(Settlement(tickets["done"], State.SUCCEEDED, "ok"))
    clocked.settle.retry_later(tickets["later"], timedelta(minutes=5))

    wanted = [Key("t1", op) for op in ("queued", "held", "done", "later", "missing")]
    claims = clocked.claims.claim_keys("w1", wanted, LEASE)
    assert ops(claims) == ["queued"]
    assert (claims[0].fence, claims[0].takeover) == (1, False)
    assert row(db, "held")[:4] == ("claimed", 1, 1, "w0")
    assert row(db, "done")[:2] == ("succeeded", 1)
    assert row(db, "later")[:2] == ("queued", 1)
    assert row(db, "other")[:2] == ("queued", 0)  # not asked for, not claimed
    assert clocked.claims.claim_keys("w1", [], LEASE) == []


def test_claim_keys_does_not_cross_tenants(clocked: PostgresStore, db: Db) -> None:
    clocked.inbox.ingest([delivery("a", tenant="t1"), delivery("a", tenant="t2")])
    (claim,) = clocked.claims.claim_keys("w1", [Key("t2", "a")], LEASE)
    assert claim.key == Key("t2", "a")
    assert row(db, "a", tenant="t1")[0] == "queued"


def test_retry_later_is_not_claimable_before_the_backoff(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked.inbox.ingest([delivery("a")])
    (first,) = clocked.claims.claim("w1", 1, LEASE)
    assert clocked.settle.retry_later(first.ticket, timedelta(seconds=60), "busy") is State.QUEUED
    # The lease is gone; the row keeps its last owner for the attempt's record.
    assert row(db, "a") == ("queued", 1, 1, "w1", None, "busy")
    clock.advance(timedelta(seconds=59))
    assert clocked.claims.claim("w2", 1, LEASE) == []
    assert clocked.claims.claim_keys("w2", [Key("t1", "a")], LEASE) == []
    clock.advance(timedelta(seconds=1))
    (second,) = clocked.claims.claim("w2", 1, LEASE)
    assert (second.fence, second.attempts, second.takeover) == (2, 2, False)
    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(first.ticket, State.SUCCEEDED, "ok"))


def test_ordered_group_releases_its_next_row_only_after_the_first_settles(
    clocked: PostgresStore,
) -> None:
    clocked.inbox.ingest(
        [
            delivery("g1", ordering_key="g"),
            delivery("g2", ordering_key="g"),
            delivery("h1", ordering_key="h"),
            delivery("h2", ordering_key="h"),
            delivery("free"),
            delivery("g3", ordering_key="g"),
        ]
    )
    first = {c.operation_id: c.ticket for c in clocked.claims.claim("w1", 10, LEASE)}
    assert sorted(first) == ["free", "g1", "h1"]
    assert clocked.claims.claim("w1", 10, LEASE) == []
    assert (
        clocked.claims.claim_keys("w1", [Key("t1", op) for op in ("g2", "g3", "h2")], LEASE) == []
    )

    # Another group moves on its own.
    clocked.settle.settle(Settlement(first["h1"], State.SUCCEEDED, "ok"))
    assert ops(clocked.claims.claim("w1", 10, LEASE)) == ["h2"]

    # Back to the queue is not settled: the group stays blocked behind its first row.
    clocked.settle.retry_later(first["g1"], timedelta(0))
    (again,) = clocked.claims.claim("w1", 10, LEASE)
    assert (again.operation_id, again.fence) == ("g1", 2)

    # Settled (here: parked) releases the next row of the group, and only that one.
    clocked.settle.settle(Settlement(again.ticket, State.UNKNOWN, "timeout"))
    (g2,) = clocked.claims.claim("w1", 10, LEASE)
    assert g2.operation_id == "g2"
    assert clocked.claims.claim_keys("w1", [Key("t1", "g3")], LEASE) == []
    clocked.settle.settle(Settlement(g2.ticket, State.SUCCEEDED, "ok"))
    assert ops(clocked.claims.claim_keys("w1", [Key("t1", "g3")], LEASE)) == ["g3"]


def test_ordered_groups_are_scoped_by_subscription(clocked: PostgresStore) -> None:
    other = delivery("x1", subscription="notices", ordering_key="g")
    clocked.inbox.ingest([delivery("g1", ordering_key="g"), other])
    assert sorted(ops(clocked.claims.claim("w1", 10, LEASE))) == ["g1", "x1"]


def test_concurrent_claimers_never_get_the_same_row(store: PostgresStore, db: Db) -> None:
    store.inbox.ingest([delivery(f"op-{i:03d}") for i in range(200)])
    workers = 8
    barrier = threading.Barrier(workers)
    got: dict[str, list[Claim]] = {}

    def work(name: str) -> None:
        barrier.wait()
        mine: list[Claim] = []
        while batch := store.claims.claim(name, 7, LEASE):
            mine.extend(batch)
        got[name] = mine

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    claimed = [c.operation_id for claims in got.values() for c in claims]
    assert len(got) == workers
    assert sorted(claimed) == [f"op-{i:03d}" for i in range(200)]  # each row exactly once
    assert {c.fence for claims in got.values() for c in claims} == {1}
    owners = dict(db.execute("SELECT operation_id, lease_owner FROM work_item").fetchall())
    assert owners == {c.operation_id: w for w, claims in got.items() for c in claims}


# -- the partial index -----------------------------------------------------------------------

TERMINAL_ROWS = 50_000
QUEUED_ROWS = 3_000


@pytest.fixture
def history(db: Db) -> None:
    """Fifty thousand settled rows: the history a long-running bridge accumulates."""
    db.execute(
        """
        INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                               payload_hash, payload_ref, state, fence, attempts, outcome_code,
                               settled_at)
        SELECT 't' || (i %% 7), 'old-' || i, 'refunds', 'refund', 'A',
               sha256(int8send(i)), 'pg:old-' || i,
               (ARRAY['succeeded', 'failed_terminal', 'unknown', 'quarantined'])[1 + i %% 4],
               1, 1, 'ok', now() - interval '1 day'
          FROM generate_series(1, %s) AS i
        """,
        (TERMINAL_ROWS,),
    )
    db.execute("VACUUM ANALYZE work_item")


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def test_claim_reads_the_queued_index_not_the_history(
    store: PostgresStore, db: Db, history: None
) -> None:
    # A queue of three thousand: with fewer queued rows the planner may rather sort them all
    # (read through the partial indexes of open rows), which is cheap at that size; from a few
    # thousand it reads the queue in order and stops at the claim's LIMIT. (It cannot know how
    # many rows are due before it runs: the clock is read once, when the claim runs, so it
    # takes a third of them.)
    for start in range(0, QUEUED_ROWS, 100):
        store.inbox.ingest([delivery(f"new-{i}") for i in range(start, start + 100)])
    db.execute("ANALYZE work_item")
    pages = db.execute("SELECT relpages FROM pg_class WHERE relname = 'work_item'").fetchone()
    assert pages is not None
    assert pages[0] > 500  # the history is big enough to matter

    with db.transaction(force_rollback=True), db.cursor() as cur:
        cur.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.statement("claim"),
            {
                "worker": "w",
                "limit": 10,
                "lease": LEASE,
                "job_types": None,
                "identity_keys": None,
                "history": ATTEMPT_HISTORY_DEFAULT,
                "slots": None,
                "now": None,
            },
        )
        found = cur.fetchone()
    assert found is not None
    explained = found[0] if not isinstance(found[0], str) else json.loads(found[0])
    top = explained[0]["Plan"]
    nodes = list(plan_nodes(top))
    scans = [n for n in nodes if n.get("Relation Name") == "work_item"]
    text = json.dumps(explained)

    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], text
    (queue_scan,) = [n for n in scans if n.get("Index Name") == "work_item_due"]
    # The queue scan stops at the rows it hands to the claim: no terminal row is visited.
    assert queue_scan["Actual Rows"] == 10, text
    assert queue_scan["Shared Hit Blocks"] + queue_scan["Shared Read Blocks"] < 50, text
    assert all(n.get("Rows Removed by Filter", 0) <= 20 for n in scans), text
    touched = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert touched < pages[0] / 4, text
