"""The database gauges on a table full of history: they read open and parked rows only.

Every replica reads the gauges every 15 seconds. A count of every row grew with the succeeded
and failed history (0.36 s at 500,000 rows, 1.8 s at 2 million: bench.gauges), until near the
statement timeout every replica went unready at once. Here 200,000 terminal rows sit beside a
small backlog (queued, claimed, an expired lease, parked rows): the gauges' refresh must read
only the rows of that backlog, through the partial indexes of open and parked rows, and still
count them as :meth:`~bridge.store.PostgresStore.stats` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bridge import sql
from bridge.database import GENERIC_PLANS
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.types import Key, State
from tests.support.deliveries import delivery
from tests.support.statistics import flushed
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HISTORY_ROWS = 200_000
LEASE = timedelta(seconds=60)

#: the succeeded and failed history: rows that were settled long ago and never open again
HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, fence, attempts, outcome_code,
                       claimed_at, settled_at)
SELECT 't' || (g %% 50), 'done-' || g, CASE WHEN g %% 3 = 0 THEN 'refunds' ELSE 'orders' END,
       'refund', 'B', sha256(g::text::bytea), 'missing:' || g,
       CASE WHEN g %% 97 = 0 THEN 'failed_terminal' ELSE 'succeeded' END, 1, 1, 'ok',
       now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, %(rows)s::int) AS g
"""

#: rows read from work_item, by any scan, and its sequential scans, as far as flushed
READS = """
SELECT t.seq_scan, t.seq_tup_read + coalesce(t.idx_tup_fetch, 0),
       (SELECT coalesce(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i
         WHERE i.relname = 'work_item')
  FROM pg_stat_user_tables t WHERE t.relname = 'work_item'
"""

#: the indexes of open and parked rows only (their predicates name those states or the lease)
PARTIAL = frozenset(
    {
        "work_item_due",
        "work_item_tenant_due",
        "work_item_lease",
        "work_item_tenant_leased",
        "work_item_parked",
        "work_item_open_group",
    }
)


def backlog(store: PostgresStore) -> int:
    """Open and parked rows beside the history: 30 queued, 10 claimed (3 of them with an
    expired lease), one unknown and one quarantined, in two subscriptions. Their number."""
    store.inbox.ingest([delivery(f"open-{i}", tenant=f"t{i % 4}") for i in range(40)])
    store.inbox.ingest([delivery(f"p-{i}", subscription="orders") for i in range(2)])
    assert len(store.claims.claim("w", 7, LEASE)) == 7
    assert len(store.claims.claim("stalled", 3, timedelta(seconds=-1))) == 3  # run out already
    parked = {
        c.operation_id: c
        for c in store.claims.claim_keys("w", [Key("t1", "p-0"), Key("t1", "p-1")], LEASE)
    }
    store.settle.settle(Settlement(parked["p-0"].ticket, State.UNKNOWN, "intent_recorded"))
    store.settle.settle(Settlement(parked["p-1"].ticket, State.QUARANTINED, "bad_payload"))
    return 42


def scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan that reads work_item, with the index it
    reads (a bitmap heap scan's from its bitmap index scans)."""
    if plan.get("Relation Name") == "work_item":
        yield plan
    for child in plan.get("Plans", []):
        yield from scans(child)


#: the nodes under a bitmap heap scan that choose its rows
BITMAP = frozenset({"Bitmap Index Scan", "BitmapAnd", "BitmapOr"})


def indexes_of(node: dict[str, Any]) -> set[str]:
    """The indexes a scan reads its rows through (its subplans read other tables)."""
    if "Index Name" in node:
        return {node["Index Name"]}
    found: set[str] = set()
    for child in node.get("Plans", []):
        if child["Node Type"] in BITMAP:
            found |= indexes_of(child)
    return found


@pytest.mark.slow
def test_the_gauges_read_only_open_and_parked_rows_beside_200000_terminal_ones(
    db_url: str, db: Db
) -> None:
    """The refresh the bridge runs (as ``fencebridge run`` opens its store) reads no more rows
    of work_item than the backlog holds, and no sequential scan; its readings are the backlog's."""
    db.execute(HISTORY, {"rows": HISTORY_ROWS})
    db.execute("VACUUM ANALYZE work_item")
    store = PostgresStore.connect(db_url, min_size=1, max_size=1, generic_plans=True)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(IdentityHasher(b"gauges-tests-identity-secret"), meter_provider=meters)
    try:
        open_rows = backlog(store)
        before = flushed(store, db, READS)
        telemetry.observe(
            store.operator, interval=3600, subscriptions=["refunds", "orders", "idle"]
        )
        eventually(lambda: bool(_read(reader)), "a first reading")
        telemetry.stop_observing()
        after = flushed(store, db, READS)
        points = _read(reader)
        full = store.operator.stats()
    finally:
        meters.shutdown()
        store.close()

    seq_scans, rows, entries = (
        int(str(a)) - int(str(b)) for a, b in zip(after, before, strict=True)
    )
    # Each of the refresh's statements reads the backlog's rows at most once.
    assert rows <= 3 * open_rows, f"the gauges read {rows} rows of work_item"
    assert entries <= 3 * open_rows, f"the gauges read {entries} index entries of work_item"
    assert seq_scans == 0

    assert points[n.METRIC_QUEUE_DEPTH] == {"refunds": 30, "orders": 0, "idle": 0}
    assert points[n.METRIC_QUARANTINED] == {"work_row": 1, "delivery": 0}
    assert points[n.METRIC_STALLED] == {"": 3}
    queued = sum(c.count for c in full.counts if c.state is State.QUEUED)
    assert queued == 30
    assert full.total(State.SUCCEEDED) + full.total(State.FAILED_TERMINAL) == HISTORY_ROWS


def _read(reader: InMemoryMetricReader) -> dict[str, dict[str, float]]:
    """The database gauges' points by metric, keyed by their one label's value ('' if none)."""
    found: dict[str, dict[str, float]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    labels = dict(point.attributes or {})
                    key = str(next(iter(labels.values()))) if len(labels) == 1 else ""
                    found.setdefault(metric.name, {})[key] = getattr(point, "value", 0)
    return found if n.METRIC_STALLED in found else {}


GAUGE_STATEMENTS = {
    "stats_open": {},
    "stats_health": {"now": None},
    "waiting": {"slots": None, "rates": None, "now": None},
}


@pytest.mark.slow
def test_the_gauges_statements_reach_work_item_only_through_partial_indexes(
    db_url: str, db: Db
) -> None:
    """EXPLAIN of each statement of the refresh, as the planner chooses with sequential scans
    allowed and as the bridge's sessions plan it: every read of work_item goes through an index
    of open or parked rows, never a sequential scan or an index of every row."""
    db.execute(HISTORY, {"rows": HISTORY_ROWS})
    store = PostgresStore.connect(db_url, min_size=1, max_size=1)
    try:
        backlog(store)
    finally:
        store.close()
    db.execute("VACUUM ANALYZE work_item")
    sessions = {"planner's choice": "", "bridge's sessions": GENERIC_PLANS}
    for session, options in sessions.items():
        with psycopg.connect(db_url, autocommit=True, options=options) as conn:
            for name, params in GAUGE_STATEMENTS.items():
                found = conn.execute(
                    "EXPLAIN (FORMAT JSON) " + sql.statement(name), params
                ).fetchone()
                assert found is not None
                reads = list(scans(found[0][0]["Plan"]))
                assert reads, (session, name)
                for node in reads:
                    where = (session, name, node["Node Type"], sorted(indexes_of(node)))
                    assert node["Node Type"] != "Seq Scan", where
                    assert indexes_of(node), where
                    assert indexes_of(node) <= PARTIAL, where
