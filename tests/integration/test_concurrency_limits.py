"""Concurrency limits enforced by the claim statements: at most N rows of a job type, or of a
(job type, tenant), claimed at once, across stores on connections of their own.

The guarantee checked here is the documented one: a slot is held by a row in state claimed,
lease expired or not, and freed only when the row leaves claimed; a takeover reuses its row's
slot. So the number of claimed rows of a limited key never exceeds its limit, and a row over
the limit stays queued with no attempt used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config import load_config
from bridge.database import DATABASE_URL_ENV
from bridge.errors import LeaseLost
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.store.work import ConcurrencyLimit, Settlement, WaitingCount
from bridge.types import Claim, Key, State
from tests.support.clock import Clock
from tests.support.deliveries import delivery
from tests.support.policy import with_policy
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
LEASE = timedelta(seconds=30)
LIMIT = 3

Db = psycopg.Connection[Any]


def claimed(db: Db, job_type: str = "refund", tenant: str | None = None) -> int:
    found = db.execute(
        "SELECT count(*) FROM work_item WHERE state = 'claimed' AND job_type = %s"
        " AND (%s::text IS NULL OR tenant_id = %s)",
        (job_type, tenant, tenant),
    ).fetchone()
    assert found is not None
    return int(found[0])


def keys(claims: list[Claim]) -> set[tuple[str, str]]:
    return {(c.tenant_id, c.operation_id) for c in claims}


@pytest.fixture
def stores(db_url: str) -> Iterator[list[PostgresStore]]:
    """Four stores, each on a pool of its own (as four processes would be), limited alike."""
    policy = ClaimPolicy(concurrency={"refund": ConcurrencyLimit(total=LIMIT)})
    made = [PostgresStore.connect(db_url, max_size=3, policy=policy) for _ in range(4)]
    try:
        yield made
    finally:
        for store in made:
            store.close()


def test_concurrent_claimers_on_separate_connections_never_hold_more_than_the_limit(
    stores: list[PostgresStore], db: Db, db_url: str
) -> None:
    ops = [f"op-{i}" for i in range(10)]
    stores[0].inbox.ingest([delivery(op) for op in ops])
    lock = threading.Lock()
    held: set[str] = set()
    most = 0
    seen_in_db: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def claimer(store: PostgresStore, name: str) -> None:
        nonlocal most
        try:
            start.wait()
            while not done.is_set():
                for claim in store.claims.claim(name, 2, LEASE):
                    with lock:
                        held.add(claim.operation_id)
                        most = max(most, len(held))
                    # Hold the slot a moment, as a run does, so that claimers overlap.
                    seen_in_db.append(claimed(db_for_thread()))
                    with lock:
                        held.discard(claim.operation_id)
                    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        except BaseException as exc:  # noqa: BLE001  (reported to the test thread)
            errors.append(exc)
            done.set()

    local = threading.local()
    connections: list[Db] = []

    def db_for_thread() -> Db:
        if not hasattr(local, "db"):
            local.db = psycopg.connect(db_url, autocommit=True)
            with lock:
                connections.append(local.db)
        conn: Db = local.db
        return conn

    threads = [
        threading.Thread(target=claimer, args=(store, f"w{i}-{j}"))
        for i, store in enumerate(stores)
        for j in range(2)
    ]
    for t in threads:
        t.start()
    try:
        eventually(
            lambda: bool(errors) or succeeded(db) == len(ops), "every row claimed and settled"
        )
    finally:
        done.set()
        for t in threads:
            t.join()
        for conn in connections:
            conn.close()
    assert errors == []
    assert most <= LIMIT, f"{most} claims of one limited key were held at once"
    assert max(seen_in_db) <= LIMIT, seen_in_db
    rows = db.execute("SELECT DISTINCT fence, attempts FROM work_item").fetchall()
    assert rows == [(1, 1)], "every row claimed once: a row over the limit used no attempt"


def succeeded(db: Db) -> int:
    found = db.execute("SELECT count(*) FROM work_item WHERE state = 'succeeded'").fetchone()
    assert found is not None
    return int(found[0])


def test_a_row_over_the_limit_stays_queued_and_uses_no_attempt(
    stores: list[PostgresStore], db: Db
) -> None:
    first, second = stores[0], stores[1]
    first.inbox.ingest([delivery(f"op-{i}") for i in range(5)])
    assert len(first.claims.claim("w1", 10, LEASE)) == LIMIT
    assert second.claims.claim("w2", 10, LEASE) == []
    assert second.claims.claim_keys("w2", [Key("t1", "op-3"), Key("t1", "op-4")], LEASE) == []
    queued = db.execute(
        "SELECT operation_id, fence, attempts FROM work_item WHERE state = 'queued'"
        " ORDER BY operation_id"
    ).fetchall()
    assert queued == [("op-3", 0, 0), ("op-4", 0, 0)]
    assert claimed(db) == LIMIT


def test_a_settled_row_frees_its_slot_for_the_next_claim(
    stores: list[PostgresStore], db: Db
) -> None:
    store = stores[0]
    store.inbox.ingest([delivery(f"op-{i}") for i in range(5)])
    taken = store.claims.claim("w1", 10, LEASE)
    assert len(taken) == LIMIT
    store.settle.settle(Settlement(taken[0].ticket, State.SUCCEEDED, "ok"))
    (next_claim,) = stores[1].claims.claim_keys("w2", [Key("t1", "op-3"), Key("t1", "op-4")], LEASE)
    assert next_claim.operation_id == "op-3"
    assert claimed(db) == LIMIT


def test_a_takeover_reuses_the_expired_runs_slot_and_adds_none(
    store: PostgresStore, clock: Clock, db: Db
) -> None:
    clocked = PostgresStore(store.pool, clock=clock)
    clocked = with_policy(clocked, concurrency={"refund": ConcurrencyLimit(total=LIMIT)})
    clocked.inbox.ingest([delivery(f"op-{i}") for i in range(6)])
    first = clocked.claims.claim("w1", 10, LEASE)
    assert len(first) == LIMIT

    # Past the lease: the expired runs still hold their slots (they may still be acting), so a
    # new claim takes them over, fence + 1, and claims no queued row beside them.
    clock.advance(LEASE + timedelta(seconds=1))
    second = clocked.claims.claim("w2", 10, LEASE)
    assert keys(second) == keys(first)
    assert all(c.takeover for c in second)
    assert {c.fence for c in second} == {2}
    assert claimed(db) == LIMIT
    # A queued row is refused as long as the slots are held, even by expired claims.
    clock.advance(LEASE + timedelta(seconds=1))
    assert clocked.claims.claim_keys("w3", [Key("t1", "op-5")], LEASE) == []
    # The takeover by hand-off is allowed: it reuses its own row's slot.
    (again,) = clocked.claims.claim_keys("w3", [first[0].key], LEASE)
    assert again.takeover
    assert again.fence == 3
    assert claimed(db) == LIMIT

    # The expired runs' writes are refused by the fence; settling the current claim frees a slot.
    with pytest.raises(LeaseLost):
        clocked.settle.settle(Settlement(first[0].ticket, State.SUCCEEDED, "ok"))
    clocked.settle.settle(Settlement(again.ticket, State.SUCCEEDED, "ok"))
    assert claimed(db) == LIMIT - 1
    (fresh,) = clocked.claims.claim_keys("w4", [Key("t1", "op-5")], LEASE)
    assert (fresh.fence, fresh.attempts, fresh.takeover) == (1, 1, False)
    assert claimed(db) == LIMIT


def test_per_tenant_limits_and_other_job_types_are_not_held_back_by_a_full_key(
    store: PostgresStore, db: Db
) -> None:
    store = with_policy(store, concurrency={"refund": ConcurrencyLimit(total=3, per_tenant=1)})
    # The limited tenant's rows come first in the queue: they must not fill the claim's batch.
    store.inbox.ingest([delivery(f"a-{i}", tenant="t1") for i in range(20)])
    store.inbox.ingest([delivery(f"b-{i}", tenant="t2") for i in range(5)])
    store.inbox.ingest([delivery(f"n-{i}", tenant="t1", job_type="notify") for i in range(5)])

    # A claim takes due rows in queue order and leaves those past their key's room queued:
    # the first batch was all t1, and t1 had room for one.
    first = store.claims.claim("w1", 10, LEASE)
    assert [(c.job_type, c.tenant_id, c.operation_id) for c in first] == [("refund", "t1", "a-0")]
    # From then on the full key is skipped before the batch is taken: it holds nothing back.
    second = store.claims.claim("w2", 10, LEASE)
    by_key: dict[tuple[str, str], int] = {}
    for c in second:
        by_key[(c.job_type, c.tenant_id)] = by_key.get((c.job_type, c.tenant_id), 0) + 1
    assert by_key == {("refund", "t2"): 1, ("notify", "t1"): 5}
    assert {c.operation_id for c in second if c.job_type == "refund"} == {"b-0"}

    # Both refund tenants are at their limit; nothing else of refund is claimed.
    assert store.claims.claim("w3", 10, LEASE) == []
    assert claimed(db, "refund", "t1") == 1
    assert claimed(db, "refund", "t2") == 1
    attempts = db.execute(
        "SELECT DISTINCT attempts FROM work_item WHERE state = 'queued'"
    ).fetchall()
    assert attempts == [(0,)]


def test_the_job_type_limit_caps_the_sum_of_its_tenants(store: PostgresStore, db: Db) -> None:
    store = with_policy(store, concurrency={"refund": ConcurrencyLimit(total=3, per_tenant=2)})
    store.inbox.ingest([delivery(f"op-{i}", tenant=f"t{i % 4}") for i in range(16)])
    got = store.claims.claim("w1", 10, LEASE)
    assert len(got) == 3
    assert claimed(db) == 3
    assert all(claimed(db, "refund", f"t{i}") <= 2 for i in range(4))
    assert store.claims.claim("w2", 10, LEASE) == []


def test_without_a_limit_for_the_claimed_job_types_the_check_is_skipped(
    store: PostgresStore, db: Db
) -> None:
    store = with_policy(store, concurrency={"notify": ConcurrencyLimit(total=1)})
    store.inbox.ingest([delivery(f"op-{i}") for i in range(8)])
    assert store.claims._limits(["refund"]) is None
    assert len(store.claims.claim("w1", 10, LEASE, job_types=["refund"])) == 8


def test_waiting_counts_due_rows_by_reason_per_job_type_and_tenant(
    store: PostgresStore, db: Db
) -> None:
    limits = {"refund": ConcurrencyLimit(per_tenant=1)}
    store = with_policy(store, concurrency=limits)
    store.inbox.ingest([delivery(f"a-{i}", tenant="t1") for i in range(4)])
    store.inbox.ingest([delivery(f"b-{i}", tenant="t2") for i in range(3)])
    (b0,) = store.claims.claim_keys("w1", [Key("t2", "b-0")], LEASE)
    (a0,) = store.claims.claim_keys("w1", [Key("t1", "a-0")], LEASE)
    store.settle.rate_limited(b0.ticket, timedelta(minutes=5))

    assert store.operator.waiting() == [
        WaitingCount("refund", "t1", "limit", 3),
        WaitingCount("refund", "t2", "rate", 2),
    ]
    # Without the limits (a status run without the configuration) only the rate wait shows.
    assert store.operator.waiting({}) == [WaitingCount("refund", "t2", "rate", 2)]
    store.settle.settle(Settlement(a0.ticket, State.SUCCEEDED, "ok"))
    assert store.operator.waiting() == [WaitingCount("refund", "t2", "rate", 2)]


@pytest.mark.slow
def test_status_shows_due_rows_waiting_by_reason_per_job_type_and_tenant_hash(
    store: PostgresStore, db_url: str
) -> None:
    """``fencebridge status --config``: the limits come from the file; tenants only as hashes."""
    secret = "concurrency-status-identity-key"
    example = ROOT / "docs" / "examples" / "bridge.toml"
    per_tenant = load_config(example).jobs["refund"].concurrency_per_tenant
    assert per_tenant is not None
    store.inbox.ingest([delivery(f"a-{i}", tenant="tenant-alpha") for i in range(per_tenant + 2)])
    store.inbox.ingest([delivery(f"b-{i}", tenant="tenant-beta") for i in range(3)])
    store = with_policy(store, concurrency=load_config(example).concurrency_limits())
    assert len(
        store.claims.claim_keys("w1", [Key("tenant-alpha", f"a-{i}") for i in range(9)], LEASE)
    ) == (per_tenant)
    (beta,) = store.claims.claim_keys("w1", [Key("tenant-beta", "b-0")], LEASE)
    store.settle.rate_limited(beta.ticket, timedelta(minutes=5))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    env[IDENTITY_KEY_ENV] = secret

    def status(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "bridge", "status", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "tenant-alpha" not in done.stdout + done.stderr
        assert "tenant-beta" not in done.stdout + done.stderr
        return done.stdout

    hasher = IdentityHasher(secret.encode())
    alpha, beta_hash = hasher.tenant("tenant-alpha"), hasher.tenant("tenant-beta")
    document = json.loads(status("--json", "--config", str(example)))
    assert document["waiting"] == [
        {"job_type": "refund", "tenant": t, "reasons": r}
        for t, r in sorted([(alpha, {"limit": 2, "rate": 0}), (beta_hash, {"limit": 0, "rate": 2})])
    ]
    table = status("--config", str(example))
    assert (
        "due rows waiting (limit: over a concurrency limit; rate: a rate limit wait or no token "
        "left)" in table
    )
    assert any(line.split() == ["refund", alpha, "2", "0"] for line in table.splitlines())
    # Without the file, the limits are unknown: only the rate wait is shown.
    document = json.loads(status("--json"))
    assert document["waiting"] == [
        {"job_type": "refund", "tenant": beta_hash, "reasons": {"limit": 0, "rate": 2}}
    ]
