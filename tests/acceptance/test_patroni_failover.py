"""Fault test 5 with a real HA manager: Patroni fails the database over, mid-claim, four times.

A Patroni cluster as teams run it on their own hosts (tests/support/patroni.py): Debian's
``patroni`` with a real etcd as its store, two PostgreSQL nodes in Patroni's synchronous mode.
Two ``fencebridge run`` processes on a multi-host URL naming both nodes with
``target_session_attrs=read-write`` consume moto's SQS: 1,000 operations of classes A, B and D
(tests/support/failover_run.py), 100 of them sent twice and 10 sent again with another payload,
in ten rounds. After four of the rounds, once claims are in flight, the leader's server is
killed (``kill -9``); nothing else is done by the test: Patroni promotes the synchronous standby
and brings the old leader back as its standby (``pg_rewind`` or a fresh copy, as it decides),
and the bridges find the new leader through the URL. The class B and D targets are in a
database on another server, so what they record survives the failovers.

At the end (every message acknowledged, no row open): no operation lost (acknowledged to SQS
with no work row on the last leader), no class A effect or class D call made twice, no fence
issued twice (class B's log, class D's).
"""

from __future__ import annotations

from collections.abc import Iterator
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
from tests.support.patroni import PatroniCluster, patroni_cluster
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(600)]

#: the rounds (of the run's ten) after which the leader's server is killed
FAIL_AFTER = (1, 3, 5, 7)
#: what a round before a kill asks its handlers: each run holds its claim for 0.2 s, so the
#: round's claims are still in flight once its messages are all sent (at 10 ms a busy machine's
#: bridges had finished a round before the test looked, and no kill came mid-claim)
HELD = {"sleep_seconds": 0.2, "work_seconds": 0.2}
DEADLINE = 240.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def claimed(url: str) -> int:
    """Work rows claimed right now (0 while no server takes writes)."""
    try:
        return int(query(url, "SELECT count(*) FROM work_item WHERE state = 'claimed'")[0][0])
    except psycopg.OperationalError:
        return 0


def fail_over_mid_claim(cluster: PatroniCluster, url: str) -> int:
    """Once claims are in flight, kill the leader's server and wait while Patroni fails over.
    Returns how many rows were claimed just before the kill."""
    seen = 0

    def in_flight() -> bool:
        nonlocal seen
        seen = claimed(url)
        return seen > 0

    eventually(in_flight, "claims in flight", DEADLINE, poll=0.01)
    cluster.fail_over()
    return seen


def test_patroni_fails_over_mid_claim_and_nothing_is_lost_or_made_twice(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    create_target_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue(VisibilityTimeout="5")
    ops = [f"op-{i}" for i in range(OPERATIONS)]
    per_round = OPERATIONS // FAILOVERS
    in_flight: list[int] = []
    with patroni_cluster() as cluster:
        cluster.leader().execute("CREATE DATABASE fb")
        url = cluster.url("fb")
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        create_tables(url)
        bridges = start_bridges(tmp_path, moto, queue_url, cluster, db_url, wait=False)
        try:
            for n in range(FAILOVERS):
                batch = ops[n * per_round : (n + 1) * per_round]
                if n not in FAIL_AFTER:
                    send_round(sqs, queue_url, batch)
                    continue
                send_round(sqs, queue_url, batch, HELD)
                in_flight.append(fail_over_mid_claim(cluster, url))
                for bridge in bridges:  # nobody restarted or reconfigured them
                    bridge.wait_ready()
            eventually(
                lambda: drained(url, sqs, queue_url), "every message acked, no row open", DEADLINE
            )
        finally:
            for bridge in bridges:
                bridge.close()
        counts = measure(url, db_url, ops)
        timelines = {m["name"]: m.get("timeline") for m in cluster.members()}
        rejoins = cluster.rejoins()
    failovers = cluster.failovers
    print(f"\npatroni failover: {counts}")
    for failover in failovers:
        print(
            f"  {failover.old_leader} -> {failover.new_leader}: new leader after"
            f" {failover.to_new_leader:.1f}s, synchronous standby again after"
            f" {failover.to_replicated:.1f}s"
        )
    print(f"  claims in flight at each kill: {in_flight}; timelines {timelines}")
    print(f"  old leaders brought back by Patroni: {rejoins}")
    assert len(failovers) == len(FAIL_AFTER)
    assert all(f.new_leader != f.old_leader for f in failovers), failovers
    assert set(timelines.values()) == {1 + len(FAIL_AFTER)}, timelines
    assert counts["lost"] == 0, counts
    assert counts["duplicate_effects"] == counts["calls_twice"] == 0, counts
    assert counts["fence_reuse"] == 0, counts
