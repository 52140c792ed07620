"""What on-call needs of the console's API, over real HTTP and a real database: what awaits a
person (open conflicts and quarantined deliveries beside parked rows, each with the oldest
age), every listed row opening its operation by a signed handle, failure groups with a
rate-capped group redrive over a thousand parked rows, and closing a conflict, audited."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.console.auth import Tokens
from bridge.console.server import ConsoleServer
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, State, TargetClass
from tests.integration.test_console_api import (
    HASHER,
    TENANTS,
    TOKENS,
    VIEWER,
    Console,
    console_api,
)
from tests.integration.test_console_api import console as console  # noqa: PLC0414  (fixture)

Db = psycopg.Connection[Any]
LEASE = timedelta(seconds=60)
PARKED = 1000


def test_what_awaits_a_person_is_on_one_answer_with_the_oldest_age(console: Console) -> None:
    status, body = console.call("GET", "/api/v1/awaiting", token=VIEWER)

    assert status == 200
    found = {(a["what"], a["kind"]): a for a in body["awaiting"]}
    assert {k: a["count"] for k, a in found.items()} == {
        ("row", "unknown"): 2,
        ("row", "quarantined"): 2,
        ("row", "failed_terminal"): 2,
        ("delivery", "conflict"): 1,
        ("delivery", "quarantined"): 1,
    }
    assert all(a["oldest_seconds"] >= 0 for a in found.values())


def test_every_listed_row_opens_its_operation_by_a_signed_handle(console: Console) -> None:
    for state in ("queued", "unknown", "quarantined", "failed_terminal", "succeeded"):
        rows = console.call("GET", f"/api/v1/rows?state={state}", token=VIEWER)[1]["rows"]
        for row in rows:
            status, found = console.call("GET", f"/api/v1/operations/{row['handle']}", token=VIEWER)
            assert status == 200
            assert (found["operation"], found["work_row"]["state"]) == (row["operation"], state)
    for rejected in console.call("GET", "/api/v1/rejected", token=VIEWER)[1]["rejected"]:
        if rejected["handle"] is not None:
            status, found = console.call("GET", f"/api/v1/operations/{rejected['handle']}")
            assert (status, found["operation"]) == (200, rejected["operation"])
    # a handle is no identifier, and only the console's own open anything
    handles = " ".join(r["handle"] for r in rows)
    assert not any(t in handles for t in TENANTS)
    assert console.call("GET", "/api/v1/operations/WyJ3IiwxXQ.forged")[0] == 404
    group = console.call("GET", "/api/v1/groups")[1]["groups"][0]["handle"]
    assert console.call("GET", f"/api/v1/operations/{group}")[0] == 404


def test_failure_groups_count_every_parked_and_failed_row(console: Console, db: Db) -> None:
    status, body = console.call("GET", "/api/v1/groups", token=VIEWER)

    assert status == 200
    by_state: dict[str, int] = {}
    for g in body["groups"]:
        by_state[g["state"]] = by_state.get(g["state"], 0) + g["count"]
        assert g["first_seen"] <= g["last_seen"]
        assert g["redrivable"] == (g["state"] != "failed_terminal")
    expected = dict(
        db.execute(
            "SELECT state, count(*) FROM work_item"
            " WHERE state IN ('unknown', 'quarantined', 'failed_terminal') GROUP BY state"
        ).fetchall()
    )
    assert by_state == expected
    failed = next(g for g in body["groups"] if g["state"] == "failed_terminal")
    status, problem = console.call(
        "POST", f"/api/v1/groups/{failed['handle']}/redrive", {"reason": "r", "dry_run": True}
    )
    assert (status, "cannot be redriven" in problem["detail"]) == (400, True)


def test_a_conflict_is_closed_from_the_console_and_audited(console: Console, db: Db) -> None:
    (conflict,) = [
        r
        for r in console.call("GET", "/api/v1/rejected", token=VIEWER)[1]["rejected"]
        if r["kind"] == "conflict"
    ]
    body = {"delivery": conflict["handle"], "reason": "producer told", "dry_run": False}
    assert console.call("POST", "/api/v1/resolve", body, token=VIEWER)[0] == 403

    status, done = console.call("POST", "/api/v1/resolve", body)

    assert (status, done["resolved"]) == (200, 1)
    assert db.execute(
        "SELECT resolved_by, resolution_reason FROM rejected_delivery WHERE kind = 'conflict'"
    ).fetchall() == [("olga", "producer told")]
    status, again = console.call("POST", "/api/v1/resolve", body)
    assert (again["resolved"], "already resolved" in again["not_open"][0]) == (0, True)


@pytest.fixture
def parked(store: PostgresStore, db_url: str) -> Iterator[Console]:
    """A console over a thousand unknown rows of one job type (with replays and a conflict in
    the batch), parked by a provider timeout."""
    keyring.attach(store.keys, HASHER, used_by="test")
    deliveries = [
        Delivery(
            tenant_id=TENANTS[i % 2],
            operation_id=f"op-many-{i}",
            subscription="orders",
            job_type="charge",
            target_class=TargetClass.C,
            payload=json.dumps({"n": i}).encode(),
            max_attempts=1,
        )
        for i in range(PARKED)
    ]
    for start in range(0, PARKED, 250):
        chunk = deliveries[start : start + 250]
        store.inbox.ingest([*chunk, chunk[0]])  # a replay in every batch
        for claim in store.claims.claim_keys("worker-1", [d.key for d in chunk], LEASE):
            store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "timeout"))
    server = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0)
    server.start()
    try:
        yield Console(server.port, [], [])
    finally:
        server.stop()


def test_a_group_redrive_previews_its_count_and_is_rate_capped(parked: Console, db: Db) -> None:
    (group,) = parked.call("GET", "/api/v1/groups", token=VIEWER)[1]["groups"]
    assert (group["count"], group["state"], group["outcome_code"]) == (PARKED, "unknown", "timeout")
    redrive = f"/api/v1/groups/{group['handle']}/redrive"

    status, preview = parked.call("POST", redrive, {"reason": "provider back", "dry_run": True})
    assert (status, preview["selected"], preview["moved"]) == (200, 100, 100)
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)

    moved = []
    for _ in range(4):
        status, done = parked.call("POST", redrive, {"reason": "provider back", "dry_run": False})
        moved.append((status, done.get("moved")))
    # 300 rows a minute: the fourth hundred waits
    assert moved == [(200, 100), (200, 100), (200, 100), (429, None)]
    audited = db.execute(
        "SELECT count(*), min(actor), min(reason) FROM redrive_audit WHERE reason = 'provider back'"
    ).fetchone()
    assert audited == (300, "olga", "provider back")
    (left,) = parked.call("GET", "/api/v1/groups", token=VIEWER)[1]["groups"]
    assert left["count"] == PARKED - 300
