"""Erasure and the outbox, against PostgreSQL and moto's SQS over HTTP: an erasure never drops a
message a class A run committed and the relay has not sent. It is refused (its dry run too)
while one in scope is pending, and while one is parked unless the operator drops parked ones;
what it removes is counted and recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.database import DATABASE_URL_ENV
from bridge.demo import invoices
from bridge.errors import ErasureRefused
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.store.records import ErasureCounts
from bridge.types import Key
from tests.integration.test_outbox import (
    DESTINATION,
    Bench,
    destination,
    drain,
    sqs_sink,
)
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]
SECRET = "erasure-outbox-tests-identity-key-0001"


@pytest.fixture
def bench(store: PostgresStore, db: Db) -> Bench:
    """The outbox tests' class A job, with the key the commands below are run with."""
    invoices.install(db)
    b = Bench(store, db)
    b.hasher = IdentityHasher(SECRET.encode())
    keyring.attach(store.keys, b.hasher, used_by="test")
    return b


@pytest.fixture(scope="module")
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def erase(bench: Bench, tenant: str, **options: Any) -> ErasureCounts:
    return bench.store.operator.erase(
        tenant,
        tenant_hash=bench.hasher.tenant(tenant),
        actor="dpo",
        reason="DSR-9",
        **options,
    )


def messages(db: Db, tenant: str) -> dict[str, int]:
    rows = db.execute(
        "SELECT state, count(*) FROM outbox_message WHERE tenant_id = %s GROUP BY 1", (tenant,)
    ).fetchall()
    return {str(s): int(n) for s, n in rows}


def run_all(bench: Bench, keys: list[Key]) -> None:
    for key in keys:
        bench.run(key)


@pytest.mark.slow
def test_an_erasure_waits_for_the_relay_to_send_every_message_and_none_is_lost(
    bench: Bench, db: Db, sqs: SqsServer
) -> None:
    """500 operations of the erased tenant and 10 of another, each run committing two
    messages; the relay starts only after the first erasure was refused. The operator runs
    the erasure again until it is accepted: by then every one of the tenant's 1,000 messages
    has reached the queue, and the erasure counts them."""
    run_all(bench, bench.add([f"op-{i}" for i in range(500)], tenant="acme"))
    run_all(bench, bench.add([f"op-{i}" for i in range(10)], tenant="globex"))
    assert messages(db, "acme") == {"pending": 1000}
    written = {
        str(m)
        for (m,) in db.execute(
            "SELECT message_id FROM outbox_message WHERE tenant_id = 'acme'"
        ).fetchall()
    }

    for dry_run in (True, False):
        with pytest.raises(ErasureRefused, match=r"1000 outbox message\(s\) .* not sent yet"):
            erase(bench, "acme", dry_run=dry_run)
    assert messages(db, "acme") == {"pending": 1000}
    assert db.execute("SELECT count(*) FROM erasure_audit").fetchone() == (0,)

    queue_url = sqs.create_queue("erasure-outbox")
    relay = DestinationRelay(
        DESTINATION,
        destination(queue_url),
        bench.store.outbox,
        sqs_sink(sqs.endpoint, queue_url),
        owner="relay-1",
    )
    accepted: list[ErasureCounts] = []

    def attempt() -> bool:
        try:
            accepted.append(erase(bench, "acme"))
        except ErasureRefused:
            return False  # the operator runs it again
        return True

    relay.service.start()
    try:
        eventually(attempt, "the erasure is accepted once the relay has sent everything")
    finally:
        relay.service.stop(10)

    (counts,) = accepted
    assert (counts.outbox_sent, counts.outbox_parked) == (1000, 0)
    assert counts.work_rows == 500
    assert messages(db, "acme") == {}
    assert db.execute("SELECT outbox_sent, outbox_parked FROM erasure_audit").fetchall() == [
        (1000, 0)
    ]
    received = drain(sqs, queue_url, 1020)
    ids = {m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in received}
    assert written <= ids, f"{len(written - ids)} committed message(s) never sent"


def park(db: Db, tenant: str, operation: str) -> None:
    """One of the operation's messages parked by the relay (the queue refused it)."""
    db.execute(
        "UPDATE outbox_message SET state = 'parked', park_reason = 'InvalidParameterValue',"
        " parked_at = now() WHERE seq = (SELECT min(seq) FROM outbox_message"
        " WHERE tenant_id = %s AND operation_id = %s)",
        (tenant, operation),
    )
    db.execute(
        "UPDATE outbox_message SET state = 'sent', sent_at = now()"
        " WHERE tenant_id = %s AND state = 'pending'",
        (tenant,),
    )


def test_a_parked_message_refuses_the_erasure_unless_dropped_and_then_it_is_counted(
    bench: Bench, db: Db
) -> None:
    run_all(bench, bench.add(["op-1", "op-2"], tenant="acme"))
    park(db, "acme", "op-1")
    assert messages(db, "acme") == {"parked": 1, "sent": 3}

    with pytest.raises(ErasureRefused, match=r"1 outbox message\(s\) in scope are parked") as no:
        erase(bench, "acme")
    assert "--drop-parked-messages" in str(no.value)
    assert messages(db, "acme") == {"parked": 1, "sent": 3}

    dry = erase(bench, "acme", dry_run=True, drop_parked_messages=True)
    assert (dry.outbox_sent, dry.outbox_parked) == (3, 1)
    assert messages(db, "acme") == {"parked": 1, "sent": 3}

    counts = erase(bench, "acme", drop_parked_messages=True)
    assert (counts.outbox_sent, counts.outbox_parked, counts.work_rows) == (3, 1, 2)
    assert messages(db, "acme") == {}
    assert db.execute(
        "SELECT tenant_hash, outbox_sent, outbox_parked FROM erasure_audit"
    ).fetchall() == [(bench.hasher.tenant("acme"), 3, 1)]


def test_erasing_one_operation_is_refused_only_by_its_own_unsent_messages(
    bench: Bench, db: Db
) -> None:
    run_all(bench, bench.add(["op-1", "op-2"], tenant="acme"))
    db.execute(
        "UPDATE outbox_message SET state = 'sent', sent_at = now() WHERE operation_id = 'op-2'"
    )
    op_1 = {"operation_id": "op-1", "operation_hash": bench.hasher.operation("acme", "op-1")}
    op_2 = {"operation_id": "op-2", "operation_hash": bench.hasher.operation("acme", "op-2")}
    with pytest.raises(ErasureRefused, match=r"2 outbox message\(s\)"):
        erase(bench, "acme", **op_1)
    counts = erase(bench, "acme", **op_2)
    assert (counts.work_rows, counts.outbox_sent) == (1, 2)
    assert messages(db, "acme") == {"pending": 2}


def fencebridge(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    env[IDENTITY_KEY_ENV] = SECRET
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_the_erase_command_refuses_reports_and_drops_parked_messages_when_told(
    bench: Bench, db: Db, db_url: str
) -> None:
    run_all(bench, bench.add(["op-1"], tenant="acme"))
    erase_cmd = ["erase", "--tenant", "acme", "--reason", "DSR-9"]

    pending = fencebridge(db_url, *erase_cmd, "--dry-run")
    assert pending.returncode == 1
    assert "2 outbox message(s) in scope are committed and not sent yet" in pending.stderr
    assert "nothing was erased" in pending.stderr

    park(db, "acme", "op-1")
    parked = fencebridge(db_url, *erase_cmd)
    assert parked.returncode == 1
    assert "1 outbox message(s) in scope are parked, never sent" in parked.stderr

    done = fencebridge(db_url, *erase_cmd, "--drop-parked-messages")
    assert done.returncode == 0, done.stderr
    assert "outbox: 1 sent message(s) removed, 1 parked message(s) dropped, never sent" in (
        done.stdout
    )
    assert "tombstones hashed under every identity key held: key 1" in done.stdout
    assert messages(db, "acme") == {}
