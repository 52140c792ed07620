"""Token rates enforced by the claim statements: at most ``burst`` runs of a job type, or of a
(job type, tenant), started at once, and ``rate`` after that, across stores on connections of
their own (migration 0018).

The guarantee checked here is the documented one: every run a claim starts spends a token of
its key's bucket, a takeover too; a row with no token for it stays as it is (queued, or claimed
with its lease expired) with no attempt used; two claims of one key never both spend its last
token, because the second waits for the first's lock and then counts what it spent.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bridge import sql
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.work import ConcurrencyLimit, Rate, Settlement, TokenRate, WaitingCount
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.types import Claim, Key, State
from tests.support.clock import Clock
from tests.support.deliveries import delivery
from tests.support.policy import with_policy
from tests.support.waiting import eventually

LEASE = timedelta(seconds=30)
#: a lease no clock advance of these tests reaches: no takeover where none is looked at
LONG = timedelta(days=1)

Db = psycopg.Connection[Any]


def attempts(db: Db, state: str) -> list[tuple[int, int]]:
    """(fence, attempts) of the rows in ``state``, distinct."""
    return [
        (int(f), int(a))
        for f, a in db.execute(
            "SELECT DISTINCT fence, attempts FROM work_item WHERE state = %s ORDER BY 1, 2",
            (state,),
        ).fetchall()
    ]


def tenants(claims: list[Claim]) -> list[str]:
    return sorted(c.tenant_id for c in claims)


def test_a_full_bucket_gives_its_burst_then_the_rate_from_the_clock(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked = with_policy(clocked, rates={"refund": TokenRate(total=Rate(10, 1), burst=3)})
    clocked.inbox.ingest([delivery(f"op-{i}") for i in range(20)])
    assert len(clocked.claims.claim("w1", 10, LONG)) == 3
    assert clocked.claims.claim("w1", 10, LONG) == []
    assert clocked.claims.claim_keys("w1", [Key("t1", "op-19")], LONG) == []
    assert clocked.operator.waiting() == [WaitingCount("refund", "t1", "rate", 17)]
    clock.advance(timedelta(milliseconds=99))
    assert clocked.claims.claim("w1", 10, LONG) == [], "a token takes 100 ms to come back"
    clock.advance(timedelta(milliseconds=1))
    assert len(clocked.claims.claim("w1", 10, LONG)) == 1
    clock.advance(timedelta(milliseconds=250))
    assert len(clocked.claims.claim("w1", 10, LONG)) == 2, "2.5 tokens: two whole ones"
    clock.advance(timedelta(milliseconds=50))
    assert len(clocked.claims.claim("w1", 10, LONG)) == 1, "and the half token left is kept"
    # A long pause refills the bucket up to its burst, never beyond.
    clock.advance(timedelta(hours=1))
    assert len(clocked.claims.claim("w1", 10, LONG)) == 3
    # The rows left waiting used no attempt.
    assert attempts(db, "queued") == [(0, 0)]
    assert attempts(db, "claimed") == [(1, 1)]
    assert clocked.operator.waiting({}, {}) == [], "without the rates, nothing waits"


def test_each_tenant_has_a_bucket_within_the_job_types(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    rate = TokenRate(total=Rate(100, 1), burst=4, per_tenant=Rate(60, 60), burst_per_tenant=2)
    clocked = with_policy(clocked, rates={"refund": rate})
    # One tenant's backlog first in the queue: past its two tokens it holds nothing back.
    clocked.inbox.ingest([delivery(f"a-{i}", tenant="t1") for i in range(10)])
    clocked.inbox.ingest([delivery(f"b-{i}", tenant="t2") for i in range(10)])
    clocked.inbox.ingest([delivery(f"c-{i}", tenant="t3") for i in range(10)])
    first = clocked.claims.claim("w1", 10, LONG)
    assert tenants(first) == ["t1", "t1"]
    second = clocked.claims.claim("w1", 10, LONG)
    assert tenants(second) == ["t2", "t2"], "the job type's burst of 4 is spent"
    assert clocked.claims.claim("w1", 10, LONG) == []
    assert clocked.operator.waiting() == [
        WaitingCount("refund", "t1", "rate", 8),
        WaitingCount("refund", "t2", "rate", 8),
        WaitingCount("refund", "t3", "rate", 10),
    ]
    # 20 ms later the job type has two tokens again; t1 and t2 have none (one a second).
    clock.advance(timedelta(milliseconds=20))
    assert tenants(clocked.claims.claim("w1", 10, LONG)) == ["t3", "t3"]
    # A second on, each tenant has one token (a claim wide enough to reach all three).
    clock.advance(timedelta(seconds=1))
    assert tenants(clocked.claims.claim("w1", 30, LONG)) == ["t1", "t2", "t3"]
    assert attempts(db, "queued") == [(0, 0)]


def test_a_takeover_spends_a_token_and_waits_for_one_without_losing_its_lease_record(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked = with_policy(clocked, rates={"refund": TokenRate(total=Rate(1, 60), burst=2)})
    clocked.inbox.ingest([delivery(f"op-{i}") for i in range(3)])
    first = clocked.claims.claim("w1", 10, LEASE)
    assert len(first) == 2
    # Past the lease, 31 s of a rate of one a minute is no whole token: the expired claims
    # stay as they are (same fence, no attempt, no lease_lost record), and so does the queue.
    clock.advance(LEASE + timedelta(seconds=1))
    assert clocked.claims.claim("w2", 10, LEASE) == []
    assert clocked.claims.claim_keys("w2", [c.key for c in first], LEASE) == []
    assert attempts(db, "claimed") == [(1, 1)]
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (0,)
    # A minute after the first claims, one token: a takeover first (the oldest lease).
    clock.advance(timedelta(seconds=29))
    (taken,) = clocked.claims.claim("w2", 10, LEASE)
    assert taken.takeover
    assert (taken.fence, taken.attempts) == (2, 2)
    assert db.execute(
        "SELECT outcome FROM work_attempt WHERE operation_id = %s", (taken.operation_id,)
    ).fetchall() == [("lease_lost",)]
    assert db.execute("SELECT count(*) FROM work_attempt").fetchone() == (1,)
    # The hand-off claim spends tokens the same way.
    clock.advance(timedelta(seconds=60))
    (other,) = [c for c in first if c.key != taken.key]
    (again,) = clocked.claims.claim_keys("w3", [other.key, Key("t1", "op-2")], LEASE)
    assert again.key == other.key
    assert again.takeover


def test_rates_and_concurrency_limits_hold_together(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked = with_policy(clocked, concurrency={"refund": ConcurrencyLimit(total=2)})
    clocked = with_policy(clocked, rates={"refund": TokenRate(total=Rate(1, 1), burst=5)})
    clocked.inbox.ingest([delivery(f"op-{i}") for i in range(10)])
    got = clocked.claims.claim("w1", 10, LEASE)
    assert len(got) == 2, "the slots bind first"
    assert clocked.operator.waiting() == [WaitingCount("refund", "t1", "limit", 8)]
    for c in got:
        clocked.settle.settle(Settlement(c.ticket, State.SUCCEEDED, "ok"))
    again = clocked.claims.claim("w1", 10, LEASE)
    assert len(again) == 2
    assert clocked.claims.claim("w1", 10, LEASE) == [], "no slot is free"
    for c in again:
        clocked.settle.settle(Settlement(c.ticket, State.SUCCEEDED, "ok"))
    # Four runs from a burst of five, no time passed: one token is left.
    assert len(clocked.claims.claim("w1", 10, LEASE)) == 1
    assert clocked.operator.waiting() == [WaitingCount("refund", "t1", "rate", 5)]


def test_only_rate_limited_job_types_take_the_limited_claim(store: PostgresStore) -> None:
    store = with_policy(store, rates={"notify": TokenRate(total=Rate(1, 3600))})
    store.inbox.ingest([delivery(f"op-{i}") for i in range(8)])
    assert store.claims._limits(["refund"]) is None
    assert len(store.claims.claim("w1", 10, LEASE, job_types=["refund"])) == 8
    limits = store.claims._limits(None)
    assert limits is not None
    assert limits.slots is None
    assert limits.rates is not None
    assert limits.rates.obj == {"notify": [1, 3_600_000_000, 1, None, None, None]}


def test_two_transactions_never_both_spend_the_last_token(
    db_url: str, db: Db, store: PostgresStore
) -> None:
    """One claim holds the last token in a transaction left open; a second store's claim
    waits for its lock, and once the first commits it finds no token."""
    rate = {"refund": TokenRate(total=Rate(1, 3600), burst=1)}
    store = with_policy(store, rates=rate)
    other = PostgresStore.connect(db_url, max_size=2)
    other = with_policy(other, rates=rate)
    store.inbox.ingest([delivery(f"op-{i}") for i in range(3)])
    limits = store.claims._limits(None)
    assert limits is not None
    params = {
        "worker": "w1",
        "lease": LEASE,
        "job_types": None,
        "now": None,
        "identity_keys": None,
        "history": 20,
        "slots": limits.slots,
        "rates": limits.rates,
    }
    result: list[list[Claim]] = []
    try:
        with psycopg.connect(db_url) as holder:
            first = holder.execute(sql.with_limit("claim_limited", 5), params).fetchall()
            assert len(first) == 1, "the one token"
            waiter = threading.Thread(
                target=lambda: result.append(other.claims.claim("w2", 5, LEASE))
            )
            waiter.start()
            # The second claim waits on the job type's lock while the first is open.
            eventually(
                lambda: (
                    db.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    ).fetchone()
                    == (1,)
                ),
                "the second claim waiting for the first's lock",
            )
            assert result == []
            holder.commit()
            waiter.join(10)
        assert result == [[]], "after the first committed, no token was left"
    finally:
        other.close()
    assert db.execute("SELECT count(*) FROM work_item WHERE state = 'claimed'").fetchone() == (1,)
    assert attempts(db, "queued") == [(0, 0)]


@pytest.mark.parametrize("erasure", ["fencebridge_erase", "fencebridge_erase_under_keys"])
def test_erasing_a_tenant_deletes_its_buckets(store: PostgresStore, db: Db, erasure: str) -> None:
    store = with_policy(
        store, rates={"refund": TokenRate(total=Rate(2, 1), per_tenant=Rate(1, 60))}
    )
    store.inbox.ingest([delivery("op-1", tenant="gone"), delivery("op-2", tenant="kept")])
    for claim in store.claims.claim("w1", 10, LEASE):
        store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    assert db.execute("SELECT tenant_id FROM token_bucket ORDER BY 1").fetchall() == [
        ("",),
        ("gone",),
        ("kept",),
    ]
    if erasure == "fencebridge_erase":
        db.execute(
            "SELECT * FROM fencebridge_erase('gone', NULL, 'h', NULL, 1::smallint,"
            " ARRAY['op-1'], ARRAY[decode(repeat('00', 32), 'hex')], 'test', 'test')"
        )
    else:
        db.execute(
            "SELECT * FROM fencebridge_erase_under_keys('gone', NULL, 'h', NULL,"
            " ARRAY[1]::smallint[], ARRAY['op-1'], ARRAY[decode(repeat('00', 32), 'hex')],"
            " 'test', 'test', false)"
        )
    assert db.execute("SELECT tenant_id FROM token_bucket ORDER BY 1").fetchall() == [
        ("",),
        ("kept",),
    ]


def test_rows_with_no_token_are_the_waiting_gauges_rate(store: PostgresStore, db: Db) -> None:
    rates = {"refund": TokenRate(per_tenant=Rate(1, 3600))}
    store.inbox.ingest([delivery(f"a-{i}", tenant="t-empty") for i in range(3)])
    store.inbox.ingest([delivery(f"b-{i}", tenant="t-full") for i in range(2)])
    store = with_policy(store, rates=rates)
    (spent,) = store.claims.claim_keys("w", [Key("t-empty", "a-0")], LEASE)
    assert spent.tenant_id == "t-empty"
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    hasher = IdentityHasher(b"token-rate-gauge-secret")
    # A store without the rates of its own: the gauge takes those the bridge claims under.
    plain = PostgresStore(store.pool)
    try:
        Telemetry(hasher, meter_provider=meters).observe(plain.operator, interval=3600, rates=rates)

        def points() -> dict[tuple[str, str], int]:
            data = reader.get_metrics_data()
            return {
                (str(p.attributes[n.LABEL_REASON]), str(p.attributes[n.LABEL_TENANT_HASH])): int(
                    p.value
                )
                for r in (data.resource_metrics if data else ())
                for scope in r.scope_metrics
                for metric in scope.metrics
                if metric.name == n.METRIC_WAITING
                for p in metric.data.data_points
                if p.attributes
            }

        eventually(lambda: bool(points()), "the waiting gauge's first reading")
        # t-full still has its token: its rows are not waiting for one.
        assert points() == {("rate", hasher.tenant("t-empty")): 2}
    finally:
        meters.shutdown()


def test_a_purge_removes_buckets_full_for_longer_than_its_age(
    clocked: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked = with_policy(
        clocked, rates={"refund": TokenRate(total=Rate(1, 60), per_tenant=Rate(1, 60))}
    )
    clocked.inbox.ingest([delivery("op-1", tenant="t1"), delivery("op-2", tenant="t2")])
    (first,) = clocked.claims.claim("w1", 10, LONG)
    clocked.settle.settle(Settlement(first.ticket, State.SUCCEEDED, "ok"))
    clock.advance(timedelta(minutes=1))
    (second,) = clocked.claims.claim("w1", 10, LONG)
    clocked.settle.settle(Settlement(second.ticket, State.SUCCEEDED, "ok"))
    # t1's bucket is full again a minute after its claim; the job type's and t2's a minute
    # after the second claim.
    clock.advance(timedelta(seconds=30))
    assert clocked.operator.purge_batch(timedelta(seconds=20), 100) is not None
    assert db.execute("SELECT tenant_id FROM token_bucket ORDER BY 1").fetchall() == [
        ("",),
        (second.tenant_id,),
    ]
    clock.advance(timedelta(minutes=1))
    assert clocked.operator.purge_batch(timedelta(seconds=20), 100) is not None
    assert db.execute("SELECT count(*) FROM token_bucket").fetchone() == (0,)
