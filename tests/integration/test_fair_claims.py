"""Tenant-fair and prioritised claiming on real PostgreSQL.

With tenant fairness on, a claim walks the tenants that have queued rows from the one after the
last it served, and takes each tenant's share by its weight; a priority moves a row earlier in
its claim order by a bounded amount (aging). These tests write rows through the store, as the
inbox does, and read which rows the claims take.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.store.work import Settlement
from bridge.types import State
from tests.support.clock import Clock
from tests.support.deliveries import delivery

Db = psycopg.Connection[Any]

LEASE = timedelta(seconds=60)


def flood(store: PostgresStore, tenant: str, rows: int) -> None:
    """``rows`` new operations of ``tenant``, written in batches of 500 as a busy inbox would."""
    for i in range(0, rows, 500):
        store.inbox.ingest(
            [delivery(f"{tenant}-{n}", tenant=tenant) for n in range(i, min(i + 500, rows))]
        )


def claimed_tenants(store: PostgresStore, claims: int, batch: int = 10) -> list[str]:
    """The tenants of the next ``claims`` rows claimed, settling each claim at once."""
    tenants: list[str] = []
    while len(tenants) < claims:
        got = store.claims.claim("w", batch, LEASE)
        assert got, "the queue ran dry"
        tenants += [c.tenant_id for c in got]
        assert (
            store.settle.settle_many(
                [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in got]]
            )
            == []
        )
    return tenants


@pytest.fixture
def fair(store: PostgresStore) -> Callable[..., PostgresStore]:
    def make(weights: dict[str, int] | None = None, **options: Any) -> PostgresStore:
        policy = ClaimPolicy(fairness=dict(weights or {}))
        return PostgresStore(store.pool, policy=policy, **options)

    return make


def test_a_quiet_tenants_row_is_claimed_before_a_floods_later_rows(
    fair: Callable[..., PostgresStore],
) -> None:
    store = fair()
    flood(store, "flood", 5000)
    store.inbox.ingest([delivery("quiet-1", tenant="quiet")])
    assert "quiet" in {c.tenant_id for c in store.claims.claim("w", 10, LEASE)}


def test_a_claim_stays_full_while_a_quiet_tenant_trickles(
    fair: Callable[..., PostgresStore],
) -> None:
    """Tenants with one row or none due leave the rest of the claim to the flooding tenant:
    every claim takes as many rows as it asked for, the quiet rows first in their turn."""
    store = fair()
    flood(store, "flood", 2000)
    for n in range(20):
        store.inbox.ingest([delivery(f"quiet-{n}", tenant="quiet")])
        store.inbox.ingest([delivery(f"other-{n}", tenant="other")])
        got = store.claims.claim("w", 10, LEASE)
        assert len(got) == 10, Counter(c.tenant_id for c in got)
        assert Counter(c.tenant_id for c in got) == {"flood": 8, "quiet": 1, "other": 1}
        assert (
            store.settle.settle_many(
                [Settlement(t, State.SUCCEEDED, "ok") for t in [c.ticket for c in got]]
            )
            == []
        )


@pytest.mark.slow
def test_without_fairness_rows_are_claimed_in_the_order_they_became_due(
    store: PostgresStore,
) -> None:
    flood(store, "flood", 2000)
    store.inbox.ingest([delivery("quiet-1", tenant="quiet")])
    assert "quiet" not in claimed_tenants(store, 2000)
    (last,) = store.claims.claim("w", 10, LEASE)
    assert last.tenant_id == "quiet"


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 10], ids=["one-row-claims", "ten-row-claims"])
def test_tenants_with_backlogs_take_turns(fair: Callable[..., PostgresStore], batch: int) -> None:
    """Three floods written one after the other are claimed interleaved, all along."""
    store = fair()
    for tenant in ("a", "b", "c"):
        flood(store, tenant, 600)
    tenants = claimed_tenants(store, 300, batch)
    counts = Counter(tenants)
    assert all(95 <= counts[t] <= 105 for t in "abc"), counts
    for i in range(0, 300, 30):
        assert set(tenants[i : i + 30]) == {"a", "b", "c"}, (i, tenants[i : i + 30])


def test_the_walk_wraps_around_to_the_tenants_below_and_stays_on_the_last_one_left(
    fair: Callable[..., PostgresStore],
) -> None:
    """Past the highest tenant with queued rows the walk goes on from the lowest one; when the
    tenant served last is the only one left with rows, it is served again."""
    store = fair()
    flood(store, "a", 5)
    flood(store, "b", 1)
    flood(store, "c", 2)
    assert claimed_tenants(store, 8, batch=1) == ["a", "b", "c", "a", "c", "a", "a", "a"]
    assert store.claims.claim("w", 1, LEASE) == []


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 10, 16], ids=["one-row", "ten-row", "sixteen-row"])
def test_weights_give_their_shares_of_the_claims(
    fair: Callable[..., PostgresStore], batch: int
) -> None:
    store = fair({"heavy": 2})
    flood(store, "heavy", 1000)
    flood(store, "light", 1000)
    counts = Counter(claimed_tenants(store, 300, batch))
    assert 185 <= counts["heavy"] <= 215, counts
    assert 85 <= counts["light"] <= 115, counts


def test_two_claimers_share_one_walk_and_keep_the_turns(
    fair: Callable[..., PostgresStore],
) -> None:
    store = fair()
    for tenant in ("a", "b", "c", "d"):
        flood(store, tenant, 200)
    first, second = store.claims.claim("w1", 4, LEASE), store.claims.claim("w2", 4, LEASE)
    assert sorted(c.tenant_id for c in first) == ["a", "b", "c", "d"]
    assert sorted(c.tenant_id for c in second) == ["a", "b", "c", "d"]


def test_a_higher_priority_overtakes_a_bounded_part_of_the_queue(
    store: PostgresStore, clock: Clock
) -> None:
    """Aging: priority 1 overtakes rows due up to 60 s before it, and no more."""
    aged = PostgresStore(store.pool, clock=clock, priority_aging=timedelta(seconds=60))
    aged.inbox.ingest([delivery("low")])
    clock.advance(timedelta(seconds=30))
    aged.inbox.ingest([delivery("high-soon", priority=1)])
    clock.advance(timedelta(seconds=60))
    aged.inbox.ingest([delivery("high-late", priority=1)])
    order = [aged.claims.claim("w", 1, LEASE)[0].operation_id for _ in range(3)]
    assert order == ["high-soon", "low", "high-late"]


def test_with_fairness_priority_orders_each_tenants_rows(
    fair: Callable[..., PostgresStore], clock: Clock
) -> None:
    store = fair(clock=clock, priority_aging=timedelta(seconds=60))
    store.inbox.ingest([delivery(f"a-{i}", tenant="a") for i in range(50)])
    store.inbox.ingest([delivery("a-urgent", tenant="a", priority=5), delivery("b-1", tenant="b")])
    first = store.claims.claim("w", 2, LEASE)
    assert sorted(c.operation_id for c in first) == ["a-urgent", "b-1"]


def test_a_retried_row_keeps_its_priority(store: PostgresStore, clock: Clock) -> None:
    aged = PostgresStore(store.pool, clock=clock, priority_aging=timedelta(seconds=60))
    aged.inbox.ingest([delivery("urgent", priority=5)])
    (claim,) = aged.claims.claim("w", 1, LEASE)
    aged.inbox.ingest([delivery(f"n-{i}") for i in range(20)])
    clock.advance(timedelta(seconds=10))
    assert aged.settle.retry_later(claim.ticket, timedelta(seconds=0)) is State.QUEUED
    (again,) = aged.claims.claim("w", 1, LEASE)
    assert again.operation_id == "urgent"


@pytest.mark.parametrize("fairness", [False, True], ids=["due-order", "tenant-fair"])
def test_an_ordered_group_keeps_its_order_whatever_the_priorities(
    store: PostgresStore, fair: Callable[..., PostgresStore], fairness: bool
) -> None:
    claims = fair() if fairness else store
    claims.inbox.ingest(
        [delivery("g-1", ordering_key="g"), delivery("g-2", ordering_key="g", priority=9)]
    )
    (first,) = claims.claims.claim("w", 10, LEASE)
    assert first.operation_id == "g-1"  # g-2 waits for g-1 however high its priority
    claims.settle.settle(Settlement(first.ticket, State.SUCCEEDED, "ok"))
    (second,) = claims.claims.claim("w", 10, LEASE)
    assert second.operation_id == "g-2"


def test_a_fair_claim_takes_over_expired_leases_first(
    fair: Callable[..., PostgresStore], clock: Clock
) -> None:
    store = fair(clock=clock)
    store.inbox.ingest([delivery("stalled", tenant="z")])
    (stalled,) = store.claims.claim("w1", 1, LEASE)
    flood(store, "a", 100)
    clock.advance(LEASE * 2)
    first = store.claims.claim("w2", 3, LEASE)
    assert first[0].takeover
    assert first[0].key == stalled.key
