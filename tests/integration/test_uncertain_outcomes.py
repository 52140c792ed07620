"""Uncertain is unknown, at volume: errors raised after a class C or D call may have left.

A worker pool on real PostgreSQL runs 1,000 operations per class. Three in four of the calls
reach the target and then fail the way a client fails on an answer it cannot read
(``ValueError``, ``KeyError``, ``JSONDecodeError``). The batch carries duplicate deliveries and
conflicting ones, and the payment provider (over HTTP, on loopback) resets the connection
after applying some charges. Whatever the mix, no operation is recorded as failed or
quarantined on the strength of such an error: class C looks its key up and finds the charge,
class D parks ``unknown`` after its one call.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from bridge.demo import payments
from bridge.demo.provider import FaultKind, PaymentClient, PaymentProvider
from bridge.executors.registry import Registry
from bridge.handlers import Context, RetryPolicy, Success, UnfencedHandler
from bridge.identity import IdentityHasher
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from bridge.types import Decision, Delivery
from tests.support.deliveries import for_job
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]


HASHER = IdentityHasher(b"uncertain-outcome-tests-identity-secret")
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
RESETS = 25
#: what the client raises on an answer it cannot read, by operation number modulo 4 (0: none)
MISREAD: dict[int, Callable[[], BaseException]] = {
    1: lambda: ValueError("invalid literal for int() with base 10: 'ch_'"),
    2: lambda: KeyError("id"),
    3: lambda: json.JSONDecodeError("Expecting value", "<html>", 0),
}


def number(ctx: Context) -> int:
    return int(ctx.operation_id.rsplit("-", 1)[1])


def states(db: Db) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {s: int(n) for s, n in rows}


class MisreadCharge(payments.ChargeCustomer):
    """The demo charge; for three operations in four the client fails on the answer."""

    def perform(self, ctx: Context, key: str) -> Success:
        charged = super().perform(ctx, key)
        misread = MISREAD.get(number(ctx) % 4)
        if misread is not None and ctx.attempt == 1:
            raise misread()
        return charged


class MisreadNotify(UnfencedHandler):
    """A class D target in memory: every call lands; three in four answers cannot be read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def call(self, ctx: Context) -> None:
        with self._lock:
            self.calls[ctx.operation_id] += 1
        misread = MISREAD.get(number(ctx) % 4)
        if misread is not None:
            raise misread()


@pytest.fixture
def pool(store: PostgresStore) -> Iterator[Callable[[Registry], WorkerPool]]:
    started: list[WorkerPool] = []

    def start(registry: Registry) -> WorkerPool:
        p = WorkerPool(store, registry, HASHER, threads=8, poll_interval=0.05)
        started.append(p)
        p.start()
        return p

    yield start
    for p in started:
        p.stop(deadline=10)


def deliveries(
    registry: Registry, job: str, payload: Callable[[int], dict[str, object]]
) -> tuple[list[Delivery], list[Delivery]]:
    """Every operation once, a hundred of them twice (replays); ten changed ones (conflicts)."""
    firsts = [for_job(registry, job, f"op-{i:04d}", payload(i)) for i in range(OPERATIONS)]
    batch = [*firsts, *firsts[:DUPLICATES]]
    changed = [
        for_job(registry, job, f"op-{i:04d}", {**payload(i), "amount": 999_999})
        for i in range(CONFLICTS)
    ]
    return batch, changed


def ingest(store: PostgresStore, batch: list[Delivery]) -> Counter[Decision]:
    decisions: Counter[Decision] = Counter()
    for start in range(0, len(batch), 100):
        decisions.update(r.decision for r in store.inbox.ingest(batch[start : start + 100]))
    return decisions


@pytest.mark.slow
def test_class_c_errors_after_the_charge_are_reconciled_to_one_charge_each(
    store: PostgresStore, db: Db, pool: Callable[[Registry], WorkerPool]
) -> None:
    with PaymentProvider() as provider:
        registry = Registry()
        registry.register(payments.JOB_TYPE, MisreadCharge(PaymentClient(provider.url, 5)))
        batch, changed = deliveries(
            registry, payments.JOB_TYPE, lambda i: {"amount": 100 + i, "currency": "eur"}
        )
        provider.set_fault(FaultKind.RESET_AFTER_APPLY, times=RESETS)

        decisions = ingest(store, batch)
        running = pool(registry)
        conflicts = ingest(store, changed)  # while the pool runs
        eventually(lambda: states(db) == {"succeeded": OPERATIONS}, "every charge settled")
        running.stop(deadline=10)
        ledger = provider.ledger()
        faults_left = provider.faults()

    assert decisions == {Decision.NEW: OPERATIONS, Decision.REPLAY: DUPLICATES}
    assert conflicts == {Decision.CONFLICT: CONFLICTS}
    assert faults_left == [], "the connection resets all happened"
    keys = Counter(c.idempotency_key for c in ledger)
    assert len(ledger) == OPERATIONS
    assert set(keys.values()) == {1}, "every operation charged exactly once"
    assert keys.keys() == {HASHER.idempotency_key("t1", f"op-{i:04d}") for i in range(OPERATIONS)}
    counts = running.counts.snapshot()
    misread = sum(1 for i in range(OPERATIONS) if i % 4)
    # Every misread answer and every reset was reconciled by lookup and found applied; the
    # misread ones whose charge a reset cut short were reconciled for the reset instead.
    assert misread <= counts["reconciled.applied"] <= misread + RESETS
    assert counts["settled.succeeded"] == OPERATIONS
    assert not {k for k in counts if k.startswith("settled.") and k != "settled.succeeded"}
    rejected = db.execute("SELECT kind, count(*) FROM rejected_delivery GROUP BY kind").fetchall()
    assert rejected == [("conflict", CONFLICTS)]


@pytest.mark.promise("class-d-unknown")
def test_class_d_errors_after_the_call_are_unknown_and_called_once(
    store: PostgresStore, db: Db, pool: Callable[[Registry], WorkerPool]
) -> None:
    notify = MisreadNotify()
    registry = Registry()
    registry.register("notify", notify, retry=RetryPolicy(max_attempts=1))
    batch, changed = deliveries(registry, "notify", lambda i: {"to": f"+3100000{i:04d}"})

    decisions = ingest(store, batch)
    running = pool(registry)
    conflicts = ingest(store, changed)
    settled = {"succeeded": OPERATIONS // 4, "unknown": OPERATIONS - OPERATIONS // 4}
    eventually(lambda: states(db) == settled, "every call settled")
    running.stop(deadline=10)

    assert decisions == {Decision.NEW: OPERATIONS, Decision.REPLAY: DUPLICATES}
    assert conflicts == {Decision.CONFLICT: CONFLICTS}
    assert len(notify.calls) == OPERATIONS
    assert set(notify.calls.values()) == {1}, "one call per operation, ever"
    rows = db.execute(
        "SELECT outcome_code, outcome_detail, count(*), min(intent_fence), max(intent_fence)"
        "  FROM work_item WHERE state = 'unknown' GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    detail = "ambiguous result from an unfenced target"
    per_kind = OPERATIONS // 4
    assert rows == [
        ("JSONDecodeError", detail, per_kind, 1, 1),
        ("KeyError", detail, per_kind, 1, 1),
        ("ValueError", detail, per_kind, 1, 1),
    ]
