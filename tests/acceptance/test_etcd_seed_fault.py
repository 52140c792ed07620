"""The seed's first fault test on the etcd target, with real processes and real signals.

A worker claims, is SIGSTOPped past its lease, and a second worker takes over and writes. The
stale one is resumed and writes: etcd's own compare refuses it, the current write stays, and the
work row succeeds once. Workers are :mod:`tests.support.etcd_worker` subprocesses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bridge.identity import IDENTITY_KEY_ENV
from bridge.store import PostgresStore
from bridge.targets.etcd import stored_fence
from bridge.types import Delivery, Key, TargetClass
from tests.support.etcd_server import EtcdServer, etcd_server, require_etcd
from tests.support.etcd_worker import JOB_TYPE, EtcdWorkerProcess, etcd_key
from tests.support.worker_process import Claimed

Db = psycopg.Connection[Any]
SECRET = "etcd-seed-fault-identity-secret"
LEASE_SECONDS = 1.0
LAPSE_TIMEOUT = 30.0
TENANT = "t1"


def wait_for_lapse(db: Db, key: Key) -> None:
    """Poll until the row's lease has expired by the database clock."""
    deadline = time.monotonic() + LAPSE_TIMEOUT
    while True:
        row = db.execute(
            "SELECT state = 'claimed' AND lease_expires_at < now() FROM work_item"
            " WHERE tenant_id = %s AND operation_id = %s",
            (key.tenant_id, key.operation_id),
        ).fetchone()
        if row is not None and row[0]:
            return
        assert time.monotonic() < deadline, "the lease did not lapse"
        time.sleep(0.05)


def work_row(db: Db, key: Key) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT state, fence, attempts, outcome_code FROM work_item"
        " WHERE tenant_id = %s AND operation_id = %s",
        (key.tenant_id, key.operation_id),
    ).fetchone()


def stored(etcd: EtcdServer, operation: str) -> tuple[object, int | None]:
    """The record at the operation's key (the value and the fence it names), and its fence."""
    raw = etcd.client.get(etcd_key(TENANT, operation))
    return (None if raw is None else json.loads(raw)), stored_fence(
        etcd.client, etcd_key(TENANT, operation)
    )


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with etcd_server(require_etcd()) as server:
        yield server


@pytest.mark.slow
def test_worker_paused_past_its_lease_is_refused_by_etcd_and_the_row_succeeds_once(
    db: Db,
    db_url: str,
    store: PostgresStore,
    etcd: EtcdServer,
) -> None:
    operation = "value-1"
    store.inbox.ingest(
        [
            Delivery(
                tenant_id=TENANT,
                operation_id=operation,
                subscription="seed",
                job_type=JOB_TYPE,
                target_class=TargetClass.B,
                payload=json.dumps({"value": "current"}).encode(),
            )
        ]
    )
    key = Key(TENANT, operation)
    args = ["--database-url", db_url, "--etcd-url", etcd.url, "--tenant", TENANT]
    args += ["--operation", operation, "--lease", str(LEASE_SECONDS)]
    env = {IDENTITY_KEY_ENV: SECRET}

    with EtcdWorkerProcess([*args, "--gate", "claimed"], env) as stale:
        assert stale.claimed() == Claimed(fence=1, attempts=1, takeover=False)
        stale.at("claimed")
        stale.pause()
        wait_for_lapse(db, key)

        with EtcdWorkerProcess(args, env) as winner:
            assert winner.claimed() == Claimed(fence=2, attempts=2, takeover=True)
            assert winner.result() == {"settled.succeeded": 1}
        written = {"value": "current", "fence": 2}
        assert stored(etcd, operation) == (written, 2)

        stale.resume()
        stale.go()
        assert stale.result() == {"fenced_out": 1}
        assert stale.reached("handler")
        assert not stale.reached("effect"), "refused inside etcd's transaction"

    assert stored(etcd, operation) == (written, 2), "the current write stands"
    assert work_row(db, key) == ("succeeded", 2, 2, "value_set"), "settled once, by the winner"
