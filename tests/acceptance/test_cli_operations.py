"""The operator commands as an operator runs them: real processes on a real, migrated database.

status, inspect, redrive, sweep, purge and erase are each driven through ``python -m bridge``.
The work they act on is put in place with the store (ingest, claim, settle), the way the bridge
itself would have left it. The class C handler below answers its lookups from a provider table
in the same database, so a redrive's reconciliation asks a real system of record by the
operation's real idempotency key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge import sql
from bridge.config import parse_config
from bridge.database import DATABASE_URL_ENV, Connection
from bridge.handlers import (
    Applied,
    CannotTell,
    Context,
    IdempotentApiHandler,
    NotApplied,
    SameDatabaseHandler,
    Success,
    UnfencedHandler,
)
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.ingest.decode import decode
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, RawDelivery, Rejection, State, TargetClass, Ticket
from tests.support.bridge_process import record_identity_key

ROOT = Path(__file__).resolve().parents[2]
SECRET = "operations-acceptance-identity-key"
LEASE = timedelta(seconds=60)
HASHER = IdentityHasher(SECRET.encode())
MARKER = "PAYLOAD-MARKER-7f3a"  # in every payload: must never appear in any output

Db = psycopg.Connection[Any]


# -- handlers the configuration names (imported by the CLI process) --------------------------


class LedgerCharge(IdempotentApiHandler):
    """Class C against a provider whose record of idempotency keys is the provider_charge table."""

    def perform(self, ctx: Context, key: str) -> Success:
        with psycopg.connect(os.environ[DATABASE_URL_ENV], autocommit=True) as conn:
            conn.execute(
                "INSERT INTO provider_charge VALUES (%s, 'applied', %s) ON CONFLICT DO NOTHING",
                (key, f"ch_{ctx.fence}"),
            )
        return Success("charged")

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        with psycopg.connect(os.environ[DATABASE_URL_ENV], autocommit=True) as conn:
            found = conn.execute(
                "SELECT status, charge_id FROM provider_charge WHERE idempotency_key = %s", (key,)
            ).fetchone()
        if found is None:
            return NotApplied()
        if found[0] != "applied":
            raise CannotTell(f"the provider reports {found[0]}")
        return Applied("charged", str(found[1]))


class PostLedger(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> None:
        tx.execute("SELECT 1")


class SendSms(UnfencedHandler):
    def call(self, ctx: Context) -> None:
        return None


CONFIG = """
[jobs.charge]
handler = "tests.acceptance.test_cli_operations:LedgerCharge"
target_class = "C"
max_attempts = 2
owner = "payments-oncall"

[jobs.ledger]
handler = "tests.acceptance.test_cli_operations:PostLedger"
target_class = "A"
owner = "ledger-team"

[jobs.sms]
handler = "tests.acceptance.test_cli_operations:SendSms"
target_class = "D"
owner = "messaging-team"

[subscriptions.orders]
source = "sqs"
queue_url = "http://127.0.0.1:9/queue/orders"
job_types = ["charge", "ledger", "sms"]
schema_versions = [{versions}]

[subscriptions.orders.decode]
tenant_id = "body:/tenant"
operation_id = "body:/id"
job_type = "body:/type"
schema_version = "body:/v"
payload = "body:/data"

[retention]
purge_after_days = 30
erasure_owner = "privacy-office"
"""


def config_text(*versions: str) -> str:
    return CONFIG.replace("{versions}", ", ".join(f'"{v}"' for v in versions))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(config_text("1", "2"))
    return path


@pytest.fixture
def provider(db: Db) -> Db:
    db.execute(
        "CREATE TABLE provider_charge (idempotency_key text PRIMARY KEY, status text NOT NULL,"
        " charge_id text)"
    )
    return db


@pytest.fixture
def cli(db_url: str) -> Any:
    # the deployment's first step: its key recorded (`fencebridge identity init`)
    record_identity_key({DATABASE_URL_ENV: db_url, IDENTITY_KEY_ENV: SECRET})

    def run(*args: str, key: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
        env[DATABASE_URL_ENV] = db_url
        if key:
            env[IDENTITY_KEY_ENV] = SECRET
        done = subprocess.run(
            [sys.executable, "-m", "bridge", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert MARKER not in done.stdout + done.stderr
        if check:
            assert done.returncode == 0, done.stderr
        return done

    return run


def delivery(tenant: str, op: str, job: str = "charge", **extra: Any) -> Delivery:
    target = {"charge": TargetClass.C, "ledger": TargetClass.A, "sms": TargetClass.D}[job]
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="orders",
        job_type=job,
        target_class=target,
        payload=json.dumps({"amount": 100, "note": MARKER, **extra}).encode(),
        max_attempts=1,
    )


def parked(
    store: PostgresStore, tenant: str, op: str, job: str = "charge", *, intent: bool = False
) -> Ticket:
    """An operation whose only attempt ended ambiguous: parked as unknown."""
    store.inbox.ingest([delivery(tenant, op, job)])
    (claim,) = store.claims.claim_keys("worker-1", [delivery(tenant, op, job).key], LEASE)
    if intent:
        store.settle.record_intent(claim.ticket)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "provider_timeout"))
    return claim.ticket


def state(db: Db, tenant: str, op: str) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT state, fence, attempts, max_attempts, intent_fence, outcome_code"
        " FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (tenant, op),
    ).fetchone()


# -- status --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_status_counts_by_subscription_and_tenant_hash(
    cli: Any, store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("acme", f"q-{i}") for i in range(3)] + [delivery("globex", "q-0")])
    parked(store, "acme", "u-1")
    (stalled,) = store.claims.claim_keys("worker-2", [delivery("acme", "q-0").key], LEASE)
    db.execute(
        "UPDATE work_item SET lease_expires_at = now() - interval '1 minute'"
        " WHERE tenant_id = 'acme' AND operation_id = 'q-0'"
    )
    db.execute(
        "UPDATE work_item SET settled_at = now() - interval '2 hours'"
        " WHERE tenant_id = 'acme' AND operation_id = 'u-1'"
    )
    store.inbox.ingest([delivery("acme", "q-1", note="a different payload")])
    store.inbox.ingest([Rejection(subscription="orders", reason="body_not_json: x", body=b"{")])

    document = json.loads(cli("status", "--json").stdout)
    acme, globex = HASHER.tenant("acme"), HASHER.tenant("globex")
    counts = {c["tenant"]: c["states"] for c in document["counts"]}
    assert set(counts) == {acme, globex}
    assert counts[acme] == {
        "queued": 2,
        "claimed": 1,
        "succeeded": 0,
        "failed_terminal": 0,
        "unknown": 1,
        "quarantined": 0,
    }
    assert counts[globex]["queued"] == 1
    assert document["totals"]["queued"] == 3
    assert document["stalled_claims"] == 1
    assert 7200 <= document["oldest_unknown_seconds"] < 7200 + 600
    assert document["rejected"] == {"conflict": 1, "quarantined": 1}

    table = cli("status").stdout
    assert acme in table
    assert "stalled claims (lease expired, still claimed): 1" in table
    assert "oldest unknown: 2h 0m" in table
    assert "acme" not in table
    assert "globex" not in table
    assert stalled.fence == 1


@pytest.mark.slow
def test_status_refuses_without_the_identity_key(cli: Any) -> None:
    done = cli("status", key=False, check=False)
    assert done.returncode == 1
    assert IDENTITY_KEY_ENV in done.stderr
    assert done.stdout == ""


# -- inspect -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_inspect_shows_one_operations_history_without_its_payload(
    cli: Any, store: PostgresStore, config_file: Path, provider: Db
) -> None:
    ticket = parked(store, "acme", "op-1")
    store.inbox.ingest([delivery("acme", "op-1", note="changed")])  # a conflict on the same key
    cli("redrive", "--config", str(config_file), "--reason", "INC-7 provider back",
        "--actor", "alice")  # fmt: skip

    document = json.loads(cli("inspect", "acme", "op-1", "--json").stdout)
    row = document["work_row"]
    assert (row["state"], row["fence"], row["attempts"], row["max_attempts"]) == (
        "queued",
        ticket.fence,
        1,
        2,
    )
    assert row["target_class"] == "C"
    assert row["payload_bytes"] == len(delivery("acme", "op-1").payload)
    assert row["payload_hash"] == "sha256:" + delivery("acme", "op-1").payload_hash.hex()
    assert [
        (r["actor"], r["reason"], r["from_state"], r["to_state"]) for r in document["redrives"]
    ] == [("alice", "INC-7 provider back", "unknown", "queued")]
    (conflict,) = document["rejected_deliveries"]
    assert conflict["kind"] == "conflict"
    changed = delivery("acme", "op-1", note="changed")
    assert conflict["payload_hash"] == "sha256:" + changed.payload_hash.hex()

    assert document["log_hashes"] == [
        HASHER.tenant("acme"),
        HASHER.operation("acme", "op-1"),
    ]

    text = cli("inspect", "acme", "op-1").stdout
    assert "state          queued" in text
    assert "by alice: INC-7 provider back" in text
    assert "not shown: payload bytes" in text


@pytest.mark.slow
def test_inspect_of_an_unknown_operation_exits_1(cli: Any) -> None:
    done = cli("inspect", "acme", "nothing-here", check=False)
    assert done.returncode == 1
    assert "work row: none" in done.stdout


# -- redrive -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_redrive_reconciles_unknown_class_c_through_the_lookup_first(
    cli: Any, store: PostgresStore, db: Db, provider: Db, config_file: Path
) -> None:
    applied = parked(store, "acme", "applied")
    parked(store, "acme", "not-applied")
    pending = parked(store, "acme", "pending")
    # The provider's own record, keyed by the tenant-scoped idempotency key of each operation.
    provider.execute(
        "INSERT INTO provider_charge VALUES (%s, 'applied', 'ch_1'), (%s, 'pending', NULL)",
        (HASHER.idempotency_key("acme", "applied"), HASHER.idempotency_key("acme", "pending")),
    )
    # The same operation id under another tenant has its own key: nothing applied there.
    parked(store, "globex", "applied")

    out = cli("redrive", "--config", str(config_file), "--reason", "INC-9", "--actor", "bob").stdout

    assert state(db, "acme", "applied") == ("succeeded", applied.fence, 1, 1, None, "charged")
    assert state(db, "acme", "not-applied")[:4] == ("queued", 1, 1, 2)  # type: ignore[index]
    assert state(db, "acme", "pending") == (
        "unknown",
        pending.fence,
        1,
        1,
        None,
        "provider_timeout",
    )
    assert state(db, "globex", "applied")[0] == "queued"  # type: ignore[index]
    audit = db.execute(
        "SELECT tenant_id, operation_id, from_state, to_state, actor, reason FROM redrive_audit"
        " ORDER BY tenant_id, operation_id"
    ).fetchall()
    assert audit == [
        ("acme", "applied", "unknown", "succeeded", "bob", "INC-9"),
        ("acme", "not-applied", "unknown", "queued", "bob", "INC-9"),
        ("globex", "applied", "unknown", "queued", "bob", "INC-9"),
    ]
    assert "lookup: applied" in out
    assert "lookup cannot tell (CannotTell)" in out
    assert "redrive: 3 moved, 1 left parked" in out
    assert HASHER.operation("acme", "pending") in out
    assert "'acme'" not in out
    assert " acme " not in out


@pytest.mark.slow
def test_redrive_dry_run_writes_nothing(
    cli: Any, store: PostgresStore, db: Db, provider: Db, config_file: Path
) -> None:
    parked(store, "acme", "applied")
    parked(store, "acme", "not-applied")
    provider.execute(
        "INSERT INTO provider_charge VALUES (%s, 'applied', 'ch_1')",
        (HASHER.idempotency_key("acme", "applied"),),
    )
    before = db.execute("SELECT * FROM work_item ORDER BY operation_id").fetchall()

    out = cli("redrive", "--config", str(config_file), "--reason", "preview", "--dry-run").stdout

    assert db.execute("SELECT * FROM work_item ORDER BY operation_id").fetchall() == before
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)
    assert "would go succeeded" in out
    assert "would go queued" in out
    assert "(dry run: nothing was written)" in out


@pytest.mark.slow
def test_redrive_refuses_a_class_d_call_that_may_have_happened_until_confirmed(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    called = parked(store, "acme", "sms-called", "sms", intent=True)
    parked(store, "acme", "sms-never-called", "sms", intent=False)
    base = ["redrive", "--config", str(config_file), "--reason", "INC-3", "--state", "unknown"]

    out = cli(*base).stdout
    assert "class D intent recorded at fence 1" in out
    assert state(db, "acme", "sms-called") == ("unknown", 1, 1, 1, called.fence, "provider_timeout")
    # No intent was recorded, so the target was never called: safe to send back.
    assert state(db, "acme", "sms-never-called")[:5] == ("queued", 1, 1, 2, None)  # type: ignore[index]

    refused = cli(*base, "--confirm-not-called", check=False)
    assert refused.returncode == 2
    assert "--tenant and --operation" in refused.stderr

    cli(*base, "--confirm-not-called", "--tenant", "acme", "--operation", "sms-called")
    assert state(db, "acme", "sms-called")[:5] == ("queued", 1, 1, 2, None)  # type: ignore[index]
    reason = db.execute(
        "SELECT reason FROM redrive_audit WHERE operation_id = 'sms-called'"
    ).fetchone()
    assert reason == ("INC-3 [confirmed not called; intent at fence 1 cleared]",)


@pytest.mark.slow
def test_redrive_sends_class_a_unknown_and_quarantined_rows_back(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    parked(store, "acme", "ledger-1", "ledger")
    store.inbox.ingest([delivery("acme", "ledger-2", "ledger")])
    (claim,) = store.claims.claim_keys("w", [delivery("acme", "ledger-2", "ledger").key], LEASE)
    store.settle.settle(Settlement(claim.ticket, State.QUARANTINED, "invalid_payload"))

    cli("redrive", "--config", str(config_file), "--reason", "fixed", "--job-type", "ledger")

    assert db.execute(
        "SELECT operation_id, state, attempts, max_attempts FROM work_item ORDER BY 1"
    ).fetchall() == [("ledger-1", "queued", 1, 2), ("ledger-2", "queued", 1, 2)]
    assert db.execute(
        "SELECT operation_id, from_state FROM redrive_audit ORDER BY 1"
    ).fetchall() == [("ledger-1", "unknown"), ("ledger-2", "quarantined")]


@pytest.mark.slow
def test_redrive_decodes_quarantined_deliveries_again_with_the_current_rules(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    old_rules = parse_config(config_text("1")).decode_rules("orders")

    def received(op: str, version: str, data: object) -> Delivery | Rejection:
        body = {"tenant": "acme", "id": op, "type": "ledger", "v": version, "data": data}
        raw = RawDelivery(
            subscription="orders", message_id=f"m-{op}", body=json.dumps(body).encode(),
            attributes={},
        )  # fmt: skip
        return decode(old_rules, raw)

    newer = received("v2-op", "2", {"note": MARKER})
    unreadable = received("v9-op", "9", {"note": MARKER})
    assert isinstance(newer, Rejection)
    assert isinstance(unreadable, Rejection)
    store.inbox.ingest([newer, unreadable])

    out = cli("redrive", "--config", str(config_file), "--reason", "v2 rolled out",
              "--actor", "carol").stdout  # fmt: skip

    assert state(db, "acme", "v2-op")[:3] == ("queued", 0, 0)  # type: ignore[index]
    closed = db.execute(
        "SELECT operation_id, redriven_at IS NOT NULL, redriven_by, redrive_reason,"
        " redrive_outcome FROM rejected_delivery ORDER BY id"
    ).fetchall()
    assert closed == [
        ("v2-op", True, "carol", "v2 rolled out", "new"),
        ("v9-op", False, None, None, None),
    ]
    assert "-> new" in out
    assert "still quarantined: unknown_schema_version" in out

    # A second redrive finds the first one closed: nothing is ingested twice.
    again = cli("redrive", "--config", str(config_file), "--reason", "again").stdout
    assert "-> new" not in again
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (1,)


@pytest.mark.slow
def test_redrive_needs_a_reason(cli: Any, config_file: Path) -> None:
    done = cli("redrive", "--config", str(config_file), check=False)
    assert done.returncode == 2
    assert "--reason" in done.stderr


# -- sweep ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_parks_expired_last_attempts_and_says_which(
    cli: Any, store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("acme", "last"), delivery("acme", "live")])
    store.claims.claim_keys(
        "w", [delivery("acme", "last").key, delivery("acme", "live").key], LEASE
    )
    db.execute(
        "UPDATE work_item SET lease_expires_at = now() - interval '1 second'"
        " WHERE operation_id = 'last'"
    )

    out = cli("sweep").stdout

    assert out.splitlines()[0] == "parked 1 expired last attempt(s) as unknown"
    assert HASHER.operation("acme", "last") in out
    assert state(db, "acme", "last")[0] == "unknown"  # type: ignore[index]
    assert state(db, "acme", "live")[0] == "claimed"  # type: ignore[index]
    assert cli("sweep").stdout.splitlines() == ["parked 0 expired last attempt(s) as unknown"]


# -- purge ---------------------------------------------------------------------------------------


def settled(store: PostgresStore, db: Db, op: str, final: State, days_ago: int) -> None:
    store.inbox.ingest([delivery("acme", op, "ledger")])
    (claim,) = store.claims.claim_keys("w", [delivery("acme", op, "ledger").key], LEASE)
    store.settle.settle(Settlement(claim.ticket, final, "done"))
    db.execute(
        "UPDATE work_item SET settled_at = now() - make_interval(days => %s)"
        " WHERE operation_id = %s",
        (days_ago, op),
    )


@pytest.mark.slow
def test_purge_removes_old_finished_rows_and_payloads_in_batches(
    cli: Any, store: PostgresStore, db: Db
) -> None:
    for i in range(3):
        settled(store, db, f"old-ok-{i}", State.SUCCEEDED, 40)
    settled(store, db, "old-failed", State.FAILED_TERMINAL, 40)
    settled(store, db, "old-unknown", State.UNKNOWN, 400)
    settled(store, db, "old-quarantined", State.QUARANTINED, 400)
    settled(store, db, "recent-ok", State.SUCCEEDED, 5)
    store.inbox.ingest([Rejection(subscription="orders", reason="body_not_json: x", body=b"{")])
    db.execute("UPDATE rejected_delivery SET created_at = now() - interval '400 days'")

    preview = cli("purge", "--older-than", "35d", "--dry-run").stdout
    assert preview.startswith("would purge 4 work row(s), 0 rejected deliveries and 4 payload(s)")
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (7,)

    out = cli("purge", "--older-than", "35d", "--batch-size", "2").stdout

    assert out.startswith("purged 4 work row(s), 0 rejected deliveries and 4 payload(s)")
    assert "in 3 batch(es)" in out
    left = db.execute("SELECT operation_id FROM work_item ORDER BY 1").fetchall()
    assert left == [("old-quarantined",), ("old-unknown",), ("recent-ok",)]
    orphans = db.execute(
        "SELECT count(*) FROM payload p WHERE p.tenant_id IS NOT NULL AND NOT EXISTS"
        " (SELECT 1 FROM work_item w WHERE w.payload_ref = p.payload_ref)"
    ).fetchone()
    assert orphans == (0,)
    # The quarantined delivery nobody redrove is kept, however old.
    assert db.execute("SELECT count(*) FROM rejected_delivery").fetchone() == (1,)


@pytest.mark.slow
def test_purge_takes_its_age_from_the_retention_plan(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    settled(store, db, "a", State.SUCCEEDED, 31)
    settled(store, db, "b", State.SUCCEEDED, 29)
    out = cli("purge", "--config", str(config_file)).stdout
    assert out.startswith("purged 1 work row(s)")
    assert db.execute("SELECT operation_id FROM work_item").fetchall() == [("b",)]


@pytest.mark.slow
def test_only_one_purge_runs_at_a_time(cli: Any, store: PostgresStore, db: Db, db_url: str) -> None:
    settled(store, db, "old", State.SUCCEEDED, 40)
    with psycopg.connect(db_url) as holder, holder.transaction():
        holder.execute(sql.statement("purge_lock"))
        done = cli("purge", "--older-than", "35d", check=False)
    assert done.returncode == 1
    assert "another purge is running" in done.stderr
    assert done.stdout.startswith("purged 0 work row(s)")
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (1,)


@pytest.mark.slow
def test_a_purge_within_a_brokers_redelivery_window_is_refused_unless_forced(
    cli: Any, store: PostgresStore, db: Db, tmp_path: Path
) -> None:
    """The rule `check` reports as no-go (control 9), in its words: without --force nothing is
    deleted, dry run included. A configuration's own subscriptions decide; without one, every
    installed source's window does (Pub/Sub's 31 days)."""
    settled(store, db, "old", State.SUCCEEDED, 40)
    settled(store, db, "week", State.SUCCEEDED, 8)

    def refused(*args: str) -> str:
        done = cli("purge", *args, check=False)
        assert done.returncode == 1, done.stdout
        assert done.stdout == ""
        assert db.execute("SELECT count(*) FROM work_item").fetchone() == (2,)
        assert done.stderr.startswith("fencebridge purge: refused, nothing deleted: ")
        return done.stderr

    err = refused("--older-than", "7d")
    assert "7 d is within a sqs subscription's redelivery window (sqs: up to 14 d)" in err
    assert "7 d is within a pubsub subscription's redelivery window (pubsub: up to 31 d)" in err
    assert "name the configuration (--config) to compare with its subscriptions only" in err
    assert "a pubsub subscription's" in refused("--older-than", "30d", "--dry-run")
    assert "(pubsub: up to 31 d)" in refused("--older-than", "36h")
    err = refused("--older-than", "32d", "--tombstone-days", "20")
    assert err.startswith(
        "fencebridge purge: refused, nothing deleted: tombstones kept 20 d, within a pubsub "
        "subscription's redelivery window (pubsub: up to 31 d): a redelivery of an erased "
        "operation would run it again (name the configuration"
    )

    week = tmp_path / "week.toml"
    week.write_text(config_text("1").replace("purge_after_days = 30", "purge_after_days = 7"))
    err = refused("--config", str(week))
    assert err == (
        "fencebridge purge: refused, nothing deleted: purge after 7 d is within orders's "
        "redelivery window (sqs: up to 14 d): a redelivery would run it again (pass --force)\n"
    )
    month = tmp_path / "month.toml"
    month.write_text(config_text("1"))
    assert "tombstones kept 14 d, within orders's redelivery window (sqs: up to 14 d)" in (
        refused("--config", str(month), "--tombstone-days", "14")
    )

    # the SQS-only configuration's 30 days are past its window, though not Pub/Sub's
    assert cli("purge", "--config", str(month)).stdout.startswith("purged 1 work row(s)")
    forced = cli("purge", "--config", str(week), "--force").stdout
    assert forced.startswith("purged 1 work row(s)")
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)


# -- erase ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_erase_removes_a_tenant_everywhere_and_records_it_by_hash(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    for tenant in ("acme", "globex"):
        parked(store, tenant, "op-1", "ledger")
        store.inbox.ingest([delivery(tenant, "op-1", note="changed")])
        store.inbox.ingest(
            [
                Rejection(
                    subscription="orders",
                    reason="unknown_job_type: x",
                    body=b"{}",
                    tenant_id=tenant,
                    operation_id="op-2",
                )
            ]
        )
    cli("redrive", "--config", str(config_file), "--reason", "r", "--state", "unknown")
    queued = cli("erase", "--tenant", "acme", "--reason", "GDPR-1", check=False)
    assert queued.returncode == 1
    assert "1 operation(s) in scope are queued or claimed" in queued.stderr
    assert "nothing was erased" in queued.stderr
    for claim in store.claims.claim("w", 10, LEASE):  # the redriven rows run
        store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))

    dry = cli("erase", "--tenant", "acme", "--reason", "GDPR-1", "--dry-run").stdout
    assert dry.startswith(f"would erase tenant {HASHER.tenant('acme')}: 1 work row(s)")
    assert db.execute("SELECT count(*) FROM erasure_audit").fetchone() == (0,)

    out = cli("erase", "--tenant", "acme", "--reason", "GDPR-1", "--actor", "dpo").stdout

    assert out.splitlines()[0] == (
        f"erased tenant {HASHER.tenant('acme')}: 1 work row(s), 2 payload(s), "
        "2 rejected deliveries, 1 redrive audit row(s); 1 tombstone(s) kept"
    )
    for table in ("work_item", "payload", "rejected_delivery", "redrive_audit"):
        tenants = db.execute(f"SELECT DISTINCT tenant_id FROM {table}").fetchall()
        assert tenants == [("globex",)], table
    audit = db.execute(
        "SELECT actor, reason, tenant_hash, work_rows, payloads, rejected_deliveries,"
        " redrive_audits FROM erasure_audit"
    ).fetchall()
    assert audit == [("dpo", "GDPR-1", HASHER.tenant("acme"), 1, 2, 2, 1)]
    assert "acme" not in out


@pytest.mark.slow
def test_erase_operation_erases_one_order_and_inspect_says_so(
    cli: Any, store: PostgresStore, db: Db
) -> None:
    parked(store, "acme", "order-1", "ledger")
    parked(store, "acme", "order-2", "ledger")

    out = cli("erase", "--tenant", "acme", "--operation", "order-1", "--reason", "DSR-7").stdout

    op_hash = HASHER.operation("acme", "order-1")
    assert out.splitlines()[0] == (
        f"erased tenant {HASHER.tenant('acme')} operation {op_hash}: 1 work row(s), "
        "1 payload(s), 0 rejected deliveries, 0 redrive audit row(s); 1 tombstone(s) kept"
    )
    assert "order-1" not in out
    assert db.execute("SELECT operation_id, state FROM work_item").fetchall() == [
        ("order-2", "unknown")
    ]
    assert db.execute("SELECT state FROM erased_operation").fetchall() == [("unknown",)]
    gone = cli("inspect", "acme", "order-1", check=False).stdout
    assert "work row: none (erased: it was erased at " in gone
    assert "a tombstone (keyed hashes, payload hash, state) makes a redelivery" in gone
    # the other order is not reached by that erasure record
    kept = cli("inspect", "acme", "order-2").stdout
    assert "erased" not in kept


# -- resolve -------------------------------------------------------------------------------------


def quarantined_delivery(tenant: str, op: str) -> Rejection:
    return Rejection(
        subscription="orders",
        reason="unknown_job_type: x",
        body=b"{}",
        tenant_id=tenant,
        operation_id=op,
    )


@pytest.mark.slow
def test_resolve_closes_conflicts_audited_and_leaves_the_work_row_untouched(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    store.inbox.ingest([delivery("acme", "op-1")])
    store.inbox.ingest([delivery("acme", "op-1", note="changed")])  # a conflict on the same key
    store.inbox.ingest([quarantined_delivery("acme", "op-2"), quarantined_delivery("acme", "op-3")])
    (conflict_id,) = db.execute(
        "SELECT id FROM rejected_delivery WHERE kind = 'conflict'"
    ).fetchone()
    (given_up,), (kept,) = db.execute(
        "SELECT id FROM rejected_delivery WHERE kind = 'quarantined' ORDER BY id"
    ).fetchall()
    work_row = db.execute("SELECT * FROM work_item").fetchall()
    status = cli("status").stdout
    assert "awaiting a person: 1 conflict, 2 quarantined" in status
    assert "`fencebridge resolve`" in status

    dry = cli("resolve", str(conflict_id), "--reason", "producer told", "--dry-run").stdout
    assert f"#{conflict_id}" in dry
    assert "would resolve 1 rejected deliveries; work rows untouched (dry run" in dry
    assert db.execute("SELECT count(*) FROM rejected_delivery WHERE resolved_at IS NOT NULL"
                      ).fetchone() == (0,)  # fmt: skip

    out = cli("resolve", "--tenant", "acme", "--kind", "conflict", "--reason", "INC-9 producer "
              "fixed its payload builder", "--actor", "bob").stdout  # fmt: skip
    assert out.splitlines()[1].split()[:4] == [
        f"#{conflict_id}",
        "conflict",
        "orders",
        HASHER.tenant("acme"),
    ]
    assert "acme" not in out
    assert "op-1" not in out
    assert out.splitlines()[-1] == "resolved 1 rejected deliveries; work rows untouched"
    cli("resolve", str(given_up), "--reason", "garbage from a test producer")
    audit = db.execute(
        "SELECT id, resolved_by, resolution_reason, resolved_at IS NOT NULL, redriven_at"
        " FROM rejected_delivery ORDER BY id"
    ).fetchall()
    user = audit[1][1]
    assert audit == [
        (conflict_id, "bob", "INC-9 producer fixed its payload builder", True, None),
        (given_up, user, "garbage from a test producer", True, None),
        (kept, None, None, False, None),
    ]
    assert user  # the actor defaults to the OS user, as redrive's does
    assert db.execute("SELECT * FROM work_item").fetchall() == work_row

    document = json.loads(cli("status", "--json").stdout)
    assert document["rejected"] == {"conflict": 0, "quarantined": 1}
    inspected = json.loads(cli("inspect", "acme", "op-1", "--json").stdout)
    (record,) = inspected["rejected_deliveries"]
    assert (record["open"], record["resolved_by"], record["redriven_at"]) == (False, "bob", None)
    text = cli("inspect", "acme", "op-1").stdout
    assert "conflict  orders  resolved " in text
    assert "by bob: INC-9 producer fixed its payload builder" in text

    # A resolved quarantined delivery is not decoded again; the open one still is.
    redrive = cli("redrive", "--config", str(config_file), "--reason", "r", "--state",
                  "quarantined", "--dry-run").stdout  # fmt: skip
    assert f"delivery #{kept}" in redrive
    assert f"delivery #{given_up}" not in redrive
    # Closed deliveries age out with retention; the open quarantined one is kept.
    db.execute("UPDATE rejected_delivery SET created_at = now() - interval '400 days'")
    preview = cli("purge", "--older-than", "35d", "--dry-run").stdout
    assert "2 rejected deliveries" in preview

    again = cli("resolve", str(conflict_id), "999999", "--reason", "r", check=False)
    assert again.returncode == 1
    assert f"#{conflict_id}: not resolved: already resolved by bob at " in again.stdout
    assert "#999999: not resolved: no such rejected delivery (never recorded, or purged" in (
        again.stdout
    )


@pytest.mark.slow
def test_resolve_refuses_without_a_reason_or_a_selection(cli: Any) -> None:
    unnamed = cli("resolve", "--reason", "r", check=False)
    assert unnamed.returncode == 2
    assert "name the deliveries: their ids" in unnamed.stderr
    no_reason = cli("resolve", "1", check=False)
    assert no_reason.returncode == 2
    assert "--reason" in no_reason.stderr


# -- inspect: what it shows and what it says of an operation that is gone -------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.slow
def test_inspect_json_has_nulls_settled_rows_no_next_attempt_and_the_trace_id(
    cli: Any, store: PostgresStore
) -> None:
    traced = replace(delivery("acme", "done"), trace_context=TRACEPARENT)
    store.inbox.ingest([traced, delivery("acme", "waiting")])
    (claim,) = store.claims.claim_keys("w", [traced.key], LEASE)
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "charged"))

    document = json.loads(cli("inspect", "acme", "done", "--json").stdout)
    row = document["work_row"]
    assert row["state"] == "succeeded"
    assert row["next_attempt_at"] is None
    assert row["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert row["traceparent"] == TRACEPARENT
    assert row["settled_at"] is not None

    def values(node: Any) -> list[Any]:
        if isinstance(node, dict):
            return [v for x in node.values() for v in values(x)]
        if isinstance(node, list):
            return [v for x in node for v in values(x)]
        return [node]

    assert "-" not in values(document)
    assert None in values(document)  # a missing value is null, never a placeholder string

    text = cli("inspect", "acme", "done").stdout
    assert "next attempt" not in text
    assert "trace id       4bf92f3577b34da6a3ce929d0e0e4736" in text
    waiting = cli("inspect", "acme", "waiting").stdout
    assert "state          queued" in waiting
    assert "next attempt   " in waiting
    assert "trace id       none recorded" in waiting
    waiting_json = json.loads(cli("inspect", "acme", "waiting", "--json").stdout)["work_row"]
    assert waiting_json["next_attempt_at"] is not None
    assert waiting_json["trace_id"] is None


@pytest.mark.slow
def test_inspect_says_whether_an_absent_operation_was_erased_purged_or_never_seen(
    cli: Any, store: PostgresStore, db: Db, config_file: Path
) -> None:
    parked(store, "acme", "old", "ledger")
    cli("redrive", "--config", str(config_file), "--reason", "r", "--state", "unknown")
    (claim,) = store.claims.claim_keys("w", [delivery("acme", "old", "ledger").key], LEASE)
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    db.execute("UPDATE work_item SET settled_at = now() - interval '40 days'")
    cli("purge", "--older-than", "35d")
    parked(store, "initech", "op-9", "ledger")
    cli("erase", "--tenant", "initech", "--reason", "GDPR-2", "--actor", "dpo")

    erased = cli("inspect", "initech", "op-9", check=False)
    assert erased.returncode == 1
    assert "work row: none (erased: its tenant was erased at " in erased.stdout
    assert "by dpo (GDPR-2)" in erased.stdout
    document = json.loads(cli("inspect", "initech", "op-9", "--json", check=False).stdout)
    assert document["work_row"] is None
    assert document["work_row_absent"]["explanation"].startswith("erased: ")
    assert [e["reason"] for e in document["work_row_absent"]["tenant_erasures"]] == ["GDPR-2"]

    purged = cli("inspect", "acme", "old").stdout  # its redrive audit is still found: exit 0
    assert "work row: none (purged by retention: the records below show it was ingested" in (purged)
    never = cli("inspect", "acme", "no-such-op", check=False).stdout
    assert "work row: none (never ingested, or purged by retention: no erasure of its tenant" in (
        never
    )
    unchecked = cli("inspect", "initech", "op-9", key=False, check=False).stdout
    assert "never ingested, purged by retention or erased with its tenant: set " in unchecked
    assert "$FENCEBRIDGE_IDENTITY_KEY to check the erasure record" in unchecked
