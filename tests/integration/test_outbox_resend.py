"""``fencebridge resend``: parked outbox messages back to the relay, audited like a redrive.

Messages a queue refused (its ``MaximumMessageSize`` too small for them) are parked by the
relay against moto's SQS. Once the queue takes larger messages, a dry run shows what would go
back and how many match, and writes nothing; the command then sends them back by destination,
tenant, operation or message id, oldest parked first and up to ``--limit``, each move written
to ``outbox_audit`` (who, why, the attempts and park reason it had) and shown by ``inspect``.
The relay sends them with their ids unchanged. The bridge's role may resend; the operator's
reads the audit and writes nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.database import DATABASE_URL_ENV, Connection
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.types import Key
from tests.support.deliveries import for_job
from tests.support.outbox import destination, drain, sqs_sink
from tests.support.roles import Roles, apply_roles, drop_roles
from tests.support.sqs_server import SqsServer, sqs_server

Db = psycopg.Connection[Any]
JOB = "announce"
REFUNDS = "refunds"
LEDGER = "ledger"
#: the queues' MaximumMessageSize at first: every message below is larger
SMALL_QUEUE = 1024


class Announce(SameDatabaseHandler):
    """One 2 KiB announcement to each destination, under the operation's key."""

    def handle(self, ctx: Context, tx: Connection) -> None:
        for name in (REFUNDS, LEDGER):
            body = json.dumps({"operation": ctx.operation_id, "pad": "x" * 2048})
            ctx.outbox.publish(name, body, ordering_key=ctx.operation_id)


@pytest.fixture
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def cli(db_url: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    done = subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == expect, done.stderr
    return done


def states(db: Db) -> dict[tuple[str, str], tuple[str, int, str | None]]:
    """(destination, operation) -> (state, attempts, park reason)."""
    rows = db.execute(
        "SELECT destination, operation_id, state, attempts, park_reason FROM outbox_message"
    ).fetchall()
    return {(str(d), str(o)): (str(s), int(a), r) for d, o, s, a, r in rows}


def park_everything(
    store: PostgresStore, db: Db, sqs: SqsServer
) -> dict[str, tuple[str, DestinationRelay]]:
    """Three operations' messages, refused by both queues and parked; each queue's URL and
    relay (which holds the destination's lease)."""
    registry = Registry()
    registry.register(JOB, Announce(), outbox_destinations=frozenset({REFUNDS, LEDGER}))
    hasher = IdentityHasher(b"outbox-resend-identity-secret")
    operations = ["op-1", "op-2", "op-3"]
    store.inbox.ingest([for_job(registry, JOB, op) for op in operations])
    for op in operations:
        (claim,) = store.claims.claim_keys("worker", [Key("t1", op)], timedelta(seconds=30))
        execute(
            Run(
                store.settle, claim, registry[JOB], Context.for_claim(claim, hasher), EventCounter()
            )
        )
    queues = {
        name: sqs.create_queue(name, MaximumMessageSize=str(SMALL_QUEUE))
        for name in (REFUNDS, LEDGER)
    }
    relays = {
        name: DestinationRelay(
            name,
            destination(url, name=name, max_attempts=1),
            store.outbox,
            sqs_sink(sqs.endpoint, url),
            owner="relay-1",
        )
        for name, url in queues.items()
    }
    for relay in relays.values():
        while relay.round() is None:  # until a round finds nothing pending
            pass
    assert {s for s, _, _ in states(db).values()} == {"parked"}
    return {name: (queues[name], relays[name]) for name in queues}


@pytest.mark.slow
def test_resend_previews_then_sends_parked_messages_back_audited_and_the_relay_sends_them(
    store: PostgresStore, db: Db, db_url: str, sqs: SqsServer
) -> None:
    queues = park_everything(store, db, sqs)
    before = states(db)
    reason = before[(REFUNDS, "op-1")][2]
    assert reason is not None
    assert reason.startswith("gave up after 1 attempts: ")

    # a dry run: what would go back, and how many match; nothing written
    out = cli(db_url, "resend", "--destination", REFUNDS, "--reason", "INC-4", "--dry-run").stdout
    assert "resend: 3 of 3 matching parked message(s) would go back to pending" in out
    assert "dry run: nothing was written" in out
    assert out.count(REFUNDS) == 3
    assert LEDGER not in out
    assert reason in out, "the reason each was parked is shown"
    assert "op-" not in out, "no raw identifier"
    assert "t1" not in out, "no raw identifier"
    assert states(db) == before
    assert db.execute("SELECT count(*) FROM outbox_audit").fetchone() == (0,)

    # the cause fixed (the queues take larger messages now), two of refunds' go back
    client = sqs.client()
    for url, _ in queues.values():
        client.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": "262144"})
    out = cli(
        db_url,
        "resend",
        "--destination",
        REFUNDS,
        "--reason",
        "INC-4 queue limit raised",
        "--actor",
        "alice",
        "--limit",
        "2",
    ).stdout
    assert "resend: 2 parked message(s) back to pending, 1 left parked" in out
    after = states(db)
    moved = {op for (dest, op), (state, _, _) in after.items() if state == "pending"}
    assert moved == {"op-1", "op-2"}, "oldest parked first, refunds only"
    assert {after[(REFUNDS, op)] for op in moved} == {("pending", 0, None)}
    audit = db.execute(
        "SELECT actor, reason, destination, from_state, to_state, attempts, park_reason"
        " FROM outbox_audit ORDER BY id"
    ).fetchall()
    assert (
        audit
        == [("alice", "INC-4 queue limit raised", REFUNDS, "parked", "pending", 1, reason)] * 2
    )

    # by operation (with its tenant), across destinations; an operation needs its tenant
    cli(db_url, "resend", "--operation", "op-3", "--reason", "x", expect=2)
    out = cli(db_url, "resend", "--tenant", "t1", "--operation", "op-3", "--reason", "INC-5").stdout
    assert "resend: 2 parked message(s) back to pending, 0 left parked" in out
    # by message id
    (ledger_op1,) = db.execute(
        "SELECT message_id FROM outbox_message WHERE destination = %s AND operation_id = 'op-1'",
        (LEDGER,),
    ).fetchone() or ("",)
    out = cli(db_url, "resend", "--message", ledger_op1, "--reason", "INC-6").stdout
    assert "resend: 1 parked message(s) back to pending" in out
    assert (
        "nothing parked matches"
        in cli(db_url, "resend", "--message", ledger_op1, "--reason", "again").stdout
    )

    # inspect shows each resend of the operation's messages
    text = cli(db_url, "inspect", "t1", "op-1").stdout
    assert "outbox resends: 2" in text
    assert "parked -> pending  after 1 failed send(s)  by alice: INC-4 queue limit raised" in text
    document = json.loads(cli(db_url, "inspect", "t1", "op-1", "--json").stdout)
    assert [r["reason"] for r in document["outbox_resends"]] == [
        "INC-4 queue limit raised",
        "INC-6",
    ]

    # the relay sends what went back, with the ids it had
    pending = {
        str(r[0]): str(r[1])
        for r in db.execute(
            "SELECT message_id, destination FROM outbox_message WHERE state = 'pending'"
        )
    }
    for name, (url, relay) in queues.items():
        relay.round()
        got = drain(sqs, url, sum(1 for d in pending.values() if d == name))
        assert {m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in got} == {
            m for m, d in pending.items() if d == name
        }
    left = states(db)
    assert sorted(k for k, v in left.items() if v[0] != "sent") == [(LEDGER, "op-2")]


def test_the_bridge_role_resends_and_the_operator_role_reads_the_audit_only(
    store: PostgresStore, db: Db, db_url: str, sqs: SqsServer
) -> None:
    park_everything(store, db, sqs)
    prefix = f"fbrs_{secrets.token_hex(4)}"
    try:
        apply_roles(db_url, prefix)
        roles = Roles(prefix, db_url)
        out = cli(roles.url_as(roles.bridge), "resend", "--reason", "INC-7", "--limit", "1").stdout
        assert "resend: 1 parked message(s) back to pending, 5 left parked" in out
        with roles.connect_as(roles.operator) as conn:
            assert conn.execute("SELECT reason FROM outbox_audit").fetchall() == [("INC-7",)]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DELETE FROM outbox_audit")
        with (
            roles.connect_as(roles.bridge) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("UPDATE outbox_audit SET reason = 'rewritten'")
    finally:
        drop_roles(db_url, prefix)
