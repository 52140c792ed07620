"""The seed's fault test 5 at volume: fail the database over mid-claim, with a lagging standby.

A primary and a streaming standby built from the server's own binaries
(tests/support/replication.py); two ``fencebridge run`` processes on a multi-host URL with
``target_session_attrs=read-write``, consuming moto's SQS: 1,000 operations of three job types
(class A: an effect row in the bridge's database; class B: a fenced write of a target that logs
every claim's fence; class D: a call logged once per call), 100 of them sent twice and 10 sent
again with another payload. Ten times during the run the replication link hangs while the
bridges keep working (asynchronous: the primary runs ahead of its standby, acknowledging
commits the standby never receives; synchronous: commits wait for the standby), then the primary
is killed (``kill -9``) with claims in flight, the standby promoted and the dead node rebuilt as
the new standby. The class B and D targets are in a database on another server, so what they
record survives the failovers.

Counted per mode, at the end (every message acknowledged, no row open):

* **lost**: an operation acknowledged to SQS (gone from the queue) with no work row on the
  final primary;
* **duplicate**: a class A effect or a class D call made twice for one operation;
* **fence reuse**: two claims of one operation given the same fence (class B's log, class D's).

The modes the docs call safe (operations.md, "Durability across a failover"): synchronous
replication, and asynchronous with ``wait_for_standby``. They must lose and duplicate nothing.
Asynchronous without it loses what the standby lacked: the test shows that loss (it must be
there, or the standby did not really lag). Fences are never reused in any mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest

from bridge.store.migrate import migrate
from tests.support.failover_run import (
    FAILOVERS,
    OPERATIONS,
    drained,
    measure,
    query,
    send_round,
    start_bridges,
)
from tests.support.failover_targets import create_target_tables
from tests.support.handlers import create_tables
from tests.support.replication import Mode, Pair, replicated_pair
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]

#: work rows written on the primary while the link hangs, before the kill (asynchronous)
AHEAD = 25
DEADLINE = 240.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def fail_over_lagging(
    pair: Pair, url: str, send_round: Callable[[], None], settled: Callable[[], bool]
) -> int:
    """Once the last round is settled, hang the link, send a round of messages and let the
    primary run ahead (or its commits wait), kill it mid-claim, promote the standby, rebuild the
    old primary as the new standby. Returns the standby's lag in bytes at the kill.

    Each round starts settled (every message acknowledged, no row open, the standby caught
    up): with ``wait_for_standby`` nothing of a round is acknowledged while its link hangs, so
    without this the unacknowledged copies of every earlier round pile up in the queue and a
    round's receives return mostly replays of them, never running the primary ahead."""
    eventually(settled, "the last round settled", DEADLINE)
    pair.wait_caught_up()
    ((before,),) = query(url, "SELECT count(*) FROM work_item")
    pair.stall()
    send_round()
    if pair.mode == "async":
        # Inbox commits go on whether or not their acks wait for the standby.
        eventually(
            lambda: query(url, "SELECT count(*) FROM work_item")[0][0] >= before + AHEAD,
            "the primary to run ahead of its standby",
            DEADLINE,
        )
    else:
        eventually(
            lambda: (
                query(
                    pair.primary.url(),
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                )[0][0]
                > 0
            ),
            "commits to wait for the standby",
        )
    lag = pair.lag_bytes()
    pair.kill_primary()
    pair.promote()
    pair.rebuild()
    return lag


@pytest.mark.parametrize(
    ("mode", "wait"),
    [
        ("async", False),
        ("async", True),
        ("sync", False),
        ("sync", True),
    ],
    ids=["async", "async-wait_for_standby", "sync", "sync-wait_for_standby"],
)
def test_failovers_mid_claim_with_a_lagging_standby(
    tmp_path: Path, moto: SqsServer, db_url: str, mode: Mode, wait: bool
) -> None:
    create_target_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue(VisibilityTimeout="5")
    ops = [f"op-{i}" for i in range(OPERATIONS)]
    with replicated_pair(mode) as pair:
        pair.primary.execute("CREATE DATABASE fb")
        url = pair.url("fb")
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        create_tables(url)
        bridges = start_bridges(tmp_path, moto, queue_url, pair, db_url, wait=wait)
        lags = []
        try:
            per_round = OPERATIONS // FAILOVERS
            for n in range(FAILOVERS):
                batch = ops[n * per_round : (n + 1) * per_round]
                lags.append(
                    fail_over_lagging(
                        pair,
                        url,
                        partial(send_round, sqs, queue_url, batch),
                        partial(drained, url, sqs, queue_url),
                    )
                )
            eventually(
                lambda: drained(url, sqs, queue_url), "every message acked, no row open", DEADLINE
            )
        finally:
            for bridge in bridges:
                bridge.close()
        counts = measure(url, db_url, ops)
    assert len(lags) == FAILOVERS
    print(f"\nfailover {mode} wait_for_standby={wait}: {counts}, lag at kill (bytes): {lags}")
    assert counts["fence_reuse"] == 0, counts
    if mode == "sync" or wait:
        assert counts["lost"] == 0, counts
        assert counts["duplicate_effects"] == counts["calls_twice"] == 0, counts
    else:
        assert all(lag > 0 for lag in lags), lags
        assert counts["lost"] > 0, f"the standby lagged, so the failovers lose: {counts}"
