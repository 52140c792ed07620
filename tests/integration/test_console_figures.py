"""The console's figures over time against rows with known timestamps: claimed-but-stalled,
the oldest unknown's age, quarantines and takeovers per bucket, through the store and through
``GET /api/v1/figures``, on a store whose clock the test sets."""

from __future__ import annotations

import http.client
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
from tests.integration.test_console_api import (
    HASHER,
    TENANTS,
    TOKENS,
    VIEWER,
    console_api,
    delivery,
)
from tests.support.clock import Clock

Db = psycopg.Connection[Any]
MINUTE = timedelta(minutes=1)
T = TENANTS[0]


def put(
    db: Db,
    op: str,
    state: str,
    *,
    settled: timedelta | None = None,
    claimed: timedelta | None = None,
    lease: timedelta | None = None,
) -> None:
    """Row ``op`` in ``state``, settled, claimed and leased until that long before now."""
    now = Clock().at
    db.execute(
        "UPDATE work_item SET state = %s, settled_at = %s, claimed_at = %s, lease_expires_at = %s"
        " WHERE tenant_id = %s AND operation_id = %s",
        (
            state,
            None if settled is None else now - settled,
            None if claimed is None else now - claimed,
            None if lease is None else now - lease,
            T,
            op,
        ),
    )


@pytest.fixture
def rows(store: PostgresStore, db: Db) -> None:
    """Rows at known times before the clock's now (every time below is "before now")."""
    ops = ["quarantined-90s", "quarantined-30s", "quarantined-20m", "unknown-10m", "unknown-3m",
           "stalled", "held", "taken"]  # fmt: skip
    store.inbox.ingest([delivery(T, op) for op in ops])
    put(db, "quarantined-90s", "quarantined", settled=timedelta(seconds=90))
    put(db, "quarantined-30s", "quarantined", settled=timedelta(seconds=30))
    put(db, "quarantined-20m", "quarantined", settled=20 * MINUTE)
    put(db, "unknown-10m", "unknown", settled=10 * MINUTE)
    put(db, "unknown-3m", "unknown", settled=3 * MINUTE)
    # claimed 7 min ago, its lease ran out 4 min ago: stalled from then on
    put(db, "stalled", "claimed", claimed=7 * MINUTE, lease=4 * MINUTE)
    # claimed a minute ago, lease valid for another minute: not stalled
    put(db, "held", "claimed", claimed=MINUTE, lease=-MINUTE)
    db.execute(
        "INSERT INTO rejected_delivery (kind, reason, subscription, created_at)"
        " VALUES ('quarantined', 'undecodable', 'orders', %s)",
        (Clock().at - timedelta(minutes=5, seconds=10),),
    )
    # A takeover records the attempt it took over as lease_lost (lease_expired) at that moment;
    # an attempt that ended otherwise, or lost its lease to the sweeper, is no takeover.
    for fence, (outcome, code), before in (
        (1, ("lease_lost", "lease_expired"), timedelta(minutes=2, seconds=30)),
        (2, ("succeeded", "ok"), MINUTE),
        (3, ("lease_lost", "lease_expired_attempts_exhausted"), 3 * MINUTE),
        (4, ("lease_lost", "lease_expired"), 30 * MINUTE),
    ):
        ended = Clock().at - before
        db.execute(
            "INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at,"
            " ended_at, outcome, outcome_code) VALUES (%s, 'taken', 'claim', %s, %s, %s, %s, %s)",
            (T, fence, ended - MINUTE, ended, outcome, code),
        )


#: the expected series of the last 15 minutes, one point per minute ending at now - (14 - i) min
STALLED = [0] * 11 + [1] * 4
OLDEST = [None] * 4 + [60.0 * (i - 4) for i in range(4, 15)]
QUARANTINED = [0] * 9 + [1] + [0] * 3 + [1, 1]
TAKEOVERS = [0] * 12 + [1] + [0] * 2


@pytest.mark.usefixtures("rows")
def test_rows_with_known_timestamps_give_the_expected_series(
    store: PostgresStore, clock: Clock
) -> None:
    clocked = PostgresStore(store.pool, clock=clock)
    points = clocked.console.figures(buckets=15, bucket=MINUTE)

    assert [p.at for p in points] == [clock.at - (14 - i) * MINUTE for i in range(15)]
    assert [p.stalled for p in points] == STALLED
    assert [p.oldest_unknown_seconds for p in points] == OLDEST
    assert [p.quarantined for p in points] == QUARANTINED
    assert [p.takeovers for p in points] == TAKEOVERS


@pytest.fixture
def console_port(store: PostgresStore, clock: Clock, db_url: str) -> Iterator[int]:
    keyring.attach(store.keys, HASHER, used_by="test")
    clocked = PostgresStore(store.pool, clock=clock)
    server = ConsoleServer(console_api(clocked, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


def get(port: int, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {VIEWER}"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


@pytest.mark.usefixtures("rows")
def test_the_figures_route_answers_the_series_and_the_current_values(console_port: int) -> None:
    status, figures = get(console_port, "/api/v1/figures?window=15m")

    assert status == 200
    assert (figures["window"], figures["bucket_seconds"]) == ("15m", 60)
    series = figures["series"]
    assert [p["stalled"] for p in series] == STALLED
    assert [p["oldest_unknown_seconds"] for p in series] == OLDEST
    assert [p["quarantined"] for p in series] == QUARANTINED
    assert [p["takeovers"] for p in series] == TAKEOVERS
    assert figures["current"] == series[-1]
    assert figures["current"]["oldest_unknown_seconds"] == 600.0


def test_the_default_window_is_an_hour_per_minute_and_others_are_refused(
    console_port: int,
) -> None:
    status, figures = get(console_port, "/api/v1/figures")
    assert (status, figures["window"], len(figures["series"])) == (200, "1h", 60)
    assert {p["stalled"] for p in figures["series"]} == {0}

    status, problem = get(console_port, "/api/v1/figures?window=2h")
    assert (status, "unknown window" in problem["detail"]) == (400, True)
