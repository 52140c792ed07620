"""Operator actions against a real PostgreSQL: guarded redrives, batched purge, audited erasure,
and the check's reading of handlers and catalog.

The CLI's acceptance tests show each command end to end; these pin down the edges the commands
rely on: a redrive write made for a fence that has moved on changes nothing, purge and erasure
never reach what they must not, the erasure works with the bridge's own (non-owner)
credentials, and the check tells a real ``lookup`` from a placeholder.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from bridge import keyring, sql
from bridge.config import parse_config
from bridge.errors import ConfigError
from bridge.executors.registry import Registry, load_handler
from bridge.handlers import (
    Applied,
    CannotTell,
    Context,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    Success,
    UnfencedHandler,
)
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.operator.check import (
    build_handler,
    evaluate,
    lookup_problem,
    read_database,
)
from bridge.operator.purge import purge
from bridge.operator.redrive import Redrive
from bridge.operator.resolve import RejectionFilter, resolve
from bridge.store import PostgresStore, Settlement
from bridge.types import (
    Decision,
    Delivery,
    Key,
    RawDelivery,
    RedriveFilter,
    Rejection,
    State,
    TargetClass,
)
from tests.support.roles import Roles, apply_roles, drop_roles

Db = psycopg.Connection[Any]
LEASE = timedelta(seconds=60)
HASHER = IdentityHasher(b"operations-integration-secret")

CONFIG = """
[jobs.charge]
handler = "tests.integration.test_operations:Charge"
target_class = "C"
owner = "payments"

[jobs.sms]
handler = "tests.integration.test_operations:Sms"
target_class = "D"

[subscriptions.orders]
source = "sqs"
queue_url = "http://127.0.0.1:9/queue/orders"
job_types = [{jobs}]

[subscriptions.orders.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/id"
job_type = "attribute:type"
payload = "body:/data"
"""


def config(*jobs: str) -> Any:
    return parse_config(CONFIG.replace("{jobs}", ", ".join(f'"{j}"' for j in jobs)))


class Charge(IdempotentApiHandler):
    """Answers lookups from ``applied``: idempotency key → charge id (None: cannot tell)."""

    def __init__(self, applied: dict[str, str | None] | None = None) -> None:
        self.applied = applied or {}
        self.asked: list[str] = []

    def perform(self, ctx: Context, key: str) -> Success:
        return Success("charged")

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        self.asked.append(key)
        if key not in self.applied:
            return NotApplied()
        charge = self.applied[key]
        if charge is None:
            raise CannotTell("provider unavailable")
        return Applied("charged", charge)


class Sms(UnfencedHandler):
    def call(self, ctx: Context) -> None:
        return None


A_KEY = Key("tenant", "not a handler")


def delivery(op: str, job: str = "charge", *, tenant: str = "acme", body: str = "x") -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="orders",
        job_type=job,
        target_class=TargetClass.C if job == "charge" else TargetClass.D,
        payload=json.dumps({"body": body}).encode(),
        max_attempts=1,
    )


def park(store: PostgresStore, d: Delivery, *, intent: bool = False) -> int:
    store.inbox.ingest([d])
    (claim,) = store.claims.claim_keys("w", [d.key], LEASE)
    if intent:
        store.settle.record_intent(claim.ticket)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "timeout"))
    return claim.fence


def row_state(db: Db, op: str, tenant: str = "acme") -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT state, fence, intent_fence FROM work_item WHERE tenant_id = %s"
        " AND operation_id = %s",
        (tenant, op),
    ).fetchone()


def redrive(store: PostgresStore, handler: Charge | None = None, **options: Any) -> Redrive:
    handlers = {"charge": handler} if handler is not None else None
    return Redrive(
        store,
        config("charge", "sms"),
        HASHER,
        actor="ops",
        reason="test",
        handlers=handlers,
        **options,
    )


# -- guarded redrive writes ----------------------------------------------------------------------


def test_an_applied_lookup_does_not_settle_a_row_that_moved_on(
    store: PostgresStore, db: Db
) -> None:
    park(store, delivery("op-1"))
    (seen,) = store.operator.parked(RedriveFilter(states=(State.UNKNOWN,)))
    # Meanwhile another operator redrove it and a worker claimed it under a new fence.
    store.operator.redrive(RedriveFilter(), actor="other", reason="first")
    (claim,) = store.claims.claim("w2", 1, LEASE)

    moved = store.operator.redrive_applied(
        seen, outcome_code="charged", outcome_detail="ch_1", actor="ops", reason="late"
    )

    assert moved is False
    assert row_state(db, "op-1") == ("claimed", claim.fence, None)
    assert db.execute("SELECT actor FROM redrive_audit").fetchall() == [("other",)]


def test_a_class_d_confirmation_does_not_clear_an_intent_recorded_after_it(
    store: PostgresStore, db: Db
) -> None:
    park(store, delivery("sms-1", "sms"), intent=True)
    (seen,) = store.operator.parked(RedriveFilter())
    store.operator.redrive_unfenced(seen, actor="a", reason="confirmed")
    (claim,) = store.claims.claim("w2", 1, LEASE)
    store.settle.record_intent(claim.ticket)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, "timeout"))

    # The stale confirmation (for fence 1) must not clear the intent recorded under fence 2.
    assert store.operator.redrive_unfenced(seen, actor="b", reason="stale") is False
    assert row_state(db, "sms-1") == ("unknown", 2, 2)


def test_a_dry_run_redrive_rolls_every_write_back(store: PostgresStore, db: Db) -> None:
    park(store, delivery("applied"))
    park(store, delivery("sms", "sms"), intent=True)
    charge = Charge({HASHER.idempotency_key("acme", "applied"): "ch_9"})
    before = db.execute("SELECT * FROM work_item ORDER BY operation_id").fetchall()

    report = redrive(store, charge, dry_run=True, confirm_not_called=True).run(
        RedriveFilter(), deliveries=True
    )

    assert {(r.row.key.operation_id, r.to) for r in report.rows} == {
        ("applied", State.SUCCEEDED),
        ("sms", State.QUEUED),
    }
    assert db.execute("SELECT * FROM work_item ORDER BY operation_id").fetchall() == before
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)


def test_a_lookup_that_fails_or_a_missing_handler_leaves_the_row_unknown(
    store: PostgresStore, db: Db
) -> None:
    park(store, delivery("cannot-tell"))
    retired = Delivery(
        tenant_id="acme",
        operation_id="gone-job",
        subscription="orders",
        job_type="retired",
        target_class=TargetClass.C,
        payload=b"{}",
        max_attempts=1,
    )
    park(store, retired)
    charge = Charge({HASHER.idempotency_key("acme", "cannot-tell"): None})

    report = redrive(store, charge).run(RedriveFilter(), deliveries=False)

    notes = {r.row.key.operation_id: (r.to, r.note) for r in report.rows}
    assert notes["cannot-tell"] == (None, "lookup cannot tell (CannotTell): stays unknown")
    assert notes["gone-job"] == (None, "cannot look up: the job type is not in the configuration")
    assert row_state(db, "cannot-tell")[0] == "unknown"  # type: ignore[index]
    assert charge.asked == [HASHER.idempotency_key("acme", "cannot-tell")]


# -- quarantined deliveries ----------------------------------------------------------------------


def rejected(rules_jobs: tuple[str, ...], op: str, job: str, data: object) -> Rejection:
    raw = RawDelivery(
        subscription="orders",
        message_id=f"m-{op}",
        body=json.dumps({"id": op, "data": data}).encode(),
        attributes={"tenant": "acme", "type": job},
    )
    decoded = decode(config(*rules_jobs).decode_rules("orders"), raw)
    assert isinstance(decoded, Rejection)
    return decoded


def test_redecoding_puts_back_identity_read_from_attributes(store: PostgresStore, db: Db) -> None:
    # Quarantined while the subscription did not accept sms; the tenant and the job type came
    # from attributes, which are not stored, but were recorded on the rejection.
    store.inbox.ingest([rejected(("charge",), "sms-1", "sms", {"to": "+1"})])

    report = redrive(store).run(RedriveFilter(), deliveries=True)

    (result,) = report.deliveries
    assert (result.decision, result.key) == (Decision.NEW, Key("acme", "sms-1"))
    assert row_state(db, "sms-1") == ("queued", 0, None)
    stored = db.execute(
        "SELECT p.body FROM work_item w JOIN payload p USING (payload_ref)"
        " WHERE w.operation_id = 'sms-1'"
    ).fetchone()
    assert stored == (b'{"to":"+1"}',)


def test_a_redecoded_delivery_with_another_payload_is_a_conflict(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([rejected(("charge",), "sms-1", "sms", {"to": "+1"})])
    store.inbox.ingest([rejected(("charge",), "sms-1", "sms", {"to": "+2"})])

    report = redrive(store).run(RedriveFilter(), deliveries=True)

    assert [d.decision for d in report.deliveries] == [Decision.NEW, Decision.CONFLICT]
    assert db.execute(
        "SELECT kind, redrive_outcome FROM rejected_delivery ORDER BY id"
    ).fetchall() == [("quarantined", "new"), ("quarantined", "conflict"), ("conflict", None)]


# -- purge ---------------------------------------------------------------------------------------


def finished(store: PostgresStore, db: Db, op: str, state: State, days: int) -> None:
    store.inbox.ingest([delivery(op)])
    (claim,) = store.claims.claim_keys("w", [delivery(op).key], LEASE)
    store.settle.settle_many([Settlement(claim.ticket, state, "done")])
    db.execute(
        "UPDATE work_item SET settled_at = now() - make_interval(days => %s)"
        " WHERE operation_id = %s",
        (days, op),
    )


def test_purge_never_reaches_parked_or_live_work(store: PostgresStore, db: Db) -> None:
    finished(store, db, "ok", State.SUCCEEDED, 100)
    finished(store, db, "unknown", State.UNKNOWN, 100)
    finished(store, db, "quarantined", State.QUARANTINED, 100)
    store.inbox.ingest([delivery("queued"), delivery("claimed")])
    store.claims.claim_keys("w", [Key("acme", "claimed")], LEASE)
    db.execute("UPDATE work_item SET created_at = now() - interval '100 days'")

    report = purge(store.operator, timedelta(days=30), batch_size=10)

    assert (report.removed.work_rows, report.removed.payloads, report.locked_out) == (1, 1, False)
    left = {r[0] for r in db.execute("SELECT operation_id FROM work_item").fetchall()}
    assert left == {"unknown", "quarantined", "queued", "claimed"}


def test_purge_removes_resolved_rejections_with_their_payloads(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([rejected(("charge",), "sms-1", "sms", {"to": "+1"})])
    store.inbox.ingest([rejected(("charge",), "sms-2", "sms", {"to": "+2"})])
    redrive(store).run(RedriveFilter(keys=(Key("acme", "sms-1"),)), deliveries=True)
    db.execute("UPDATE rejected_delivery SET created_at = now() - interval '100 days'")
    payloads = db.execute("SELECT count(*) FROM payload").fetchone()

    counts = store.operator.purge_batch(timedelta(days=30), 100)

    assert counts is not None
    assert (counts.work_rows, counts.rejected_deliveries, counts.payloads) == (0, 1, 1)
    assert db.execute("SELECT operation_id FROM rejected_delivery").fetchall() == [("sms-2",)]
    assert payloads is not None
    assert db.execute("SELECT count(*) FROM payload").fetchone() == (payloads[0] - 1,)


def test_a_purge_batch_waits_for_nobody_while_another_holds_the_lock(
    store: PostgresStore, db: Db, db_url: str
) -> None:
    finished(store, db, "ok", State.SUCCEEDED, 100)
    with psycopg.connect(db_url) as other, other.transaction():
        other.execute(sql.statement("purge_lock"))
        assert store.operator.purge_batch(timedelta(days=30), 10) is None
    assert store.operator.purge_batch(timedelta(days=30), 10) is not None
    assert db.execute("SELECT count(*) FROM work_item").fetchone() == (0,)


# -- erase ---------------------------------------------------------------------------------------


@pytest.fixture
def roles(db_url: str) -> Iterator[Roles]:
    prefix = f"fbops_{secrets.token_hex(4)}"
    try:
        apply_roles(db_url, prefix)
        yield Roles(prefix, db_url)
    finally:
        drop_roles(db_url, prefix)


def test_the_bridge_role_can_erase_but_still_cannot_delete_audit_rows(roles: Roles, db: Db) -> None:
    bridge = PostgresStore.connect(roles.url_as(roles.bridge), max_size=1)
    try:
        for tenant in ("acme", "globex"):
            park(bridge, delivery("op-1", tenant=tenant))
        bridge.operator.redrive(RedriveFilter(), actor="ops", reason="r")
        with (
            roles.connect_as(roles.bridge) as conn,
            pytest.raises(errors.InsufficientPrivilege, match="table redrive_audit"),
        ):
            conn.execute("DELETE FROM redrive_audit")

        for claim in bridge.claims.claim("w", 10, LEASE):  # the redriven rows run first
            bridge.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        keyring.attach(bridge.keys, HASHER, used_by="test")
        counts = bridge.operator.erase(
            "acme", tenant_hash=HASHER.tenant("acme"), actor="dpo", reason="request-1"
        )
    finally:
        bridge.close()

    assert (counts.work_rows, counts.payloads, counts.redrive_audits) == (1, 1, 1)
    assert db.execute("SELECT DISTINCT tenant_id FROM redrive_audit").fetchall() == [("globex",)]
    assert db.execute("SELECT DISTINCT tenant_id FROM work_item").fetchall() == [("globex",)]
    assert db.execute("SELECT tenant_hash, actor FROM erasure_audit").fetchall() == [
        (HASHER.tenant("acme"), "dpo")
    ]
    with roles.connect_as(roles.operator) as conn:
        assert conn.execute("SELECT count(*) FROM erasure_audit").fetchone() == (1,)
        with pytest.raises(errors.InsufficientPrivilege, match="fencebridge_erase"):
            conn.execute(
                "SELECT fencebridge_erase('globex', NULL, 'h', NULL, 1::smallint, '{}', '{}',"
                " 'x', 'y')"
            )
        with pytest.raises(errors.InsufficientPrivilege, match="table erased_operation"):
            conn.execute("DELETE FROM erased_operation")
    # tombstones are written only by the erasure function
    with (
        roles.connect_as(roles.bridge) as conn,
        pytest.raises(errors.InsufficientPrivilege, match="table erased_operation"),
    ):
        conn.execute(
            "INSERT INTO erased_operation (key_id, operation_hash, tenant_hash, payload_hash,"
            " state, erasure_id) VALUES (1, %s, 't_x', %s, 'succeeded', 1)",
            (b"0" * 32, b"0" * 32),
        )


def test_erasing_nothing_still_leaves_a_record(store: PostgresStore, db: Db) -> None:
    keyring.attach(store.keys, HASHER, used_by="test")
    counts = store.operator.erase("nobody", tenant_hash="t_0", actor="dpo", reason="request-2")
    assert (counts.work_rows, counts.payloads) == (0, 0)
    assert db.execute("SELECT count(*) FROM erasure_audit").fetchone() == (1,)


# -- check ---------------------------------------------------------------------------------------


class _NoLookup(IdempotentApiHandler):
    def perform(self, ctx: Context, key: str) -> None:
        return None


class _EllipsisLookup(_NoLookup):
    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied: ...


class _RaisesCalled(_NoLookup):
    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        raise NotImplementedError("later")


class _RealLookup(_NoLookup):
    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        """Nothing is ever applied at this provider."""
        return NotApplied()


def test_the_check_tells_a_real_lookup_from_a_placeholder() -> None:
    assert lookup_problem(_NoLookup) == "_NoLookup.lookup is abstract (not implemented)"
    assert "does nothing" in (lookup_problem(_EllipsisLookup) or "")
    assert "only raises NotImplementedError" in (lookup_problem(_RaisesCalled) or "")
    assert lookup_problem(_RealLookup) is None
    assert lookup_problem(Charge) is None


def test_the_check_builds_handlers_with_the_function_run_uses() -> None:
    cfg = parse_config(
        CONFIG.replace(":Sms", ":_NoLookup")
        .replace('target_class = "D"', 'target_class = "C"')
        .replace("{jobs}", '"sms"')
    )
    facts = build_handler(cfg, "sms", Registry())
    assert facts.target_class is TargetClass.C
    assert facts.problem is not None
    assert "leaves lookup abstract: implement it in _NoLookup" in facts.problem
    registry = Registry()
    assert build_handler(config("charge", "sms"), "sms", registry).problem is None
    assert isinstance(registry["sms"].handler, Sms)  # built and registered, as run does
    with pytest.raises(ConfigError, match=r"cannot import module 'no\.such\.module'.*PYTHONPATH"):
        load_handler("no.such.module:x", job_type="x")
    with pytest.raises(ConfigError, match="not a fencebridge handler: the object is a Key"):
        load_handler("tests.integration.test_operations:A_KEY", job_type="x")


def test_the_check_reads_the_catalog_of_a_migrated_database(db: Db) -> None:
    facts = read_database(db)
    assert facts.schema_problem is None
    assert facts.primary_key == ("tenant_id", "operation_id")
    assert facts.row_security == {"work_item", "payload", "rejected_delivery", "redrive_audit"}
    db.execute("ALTER TABLE work_item DISABLE TRIGGER work_item_identity_immutable")
    report = evaluate(config("charge", "sms"), read_database(db))
    failed = {(f.job_type, f.control.number) for f in report.no_go}
    # charge: identity trigger off; sms: the same, no owner, and no retention plan for either.
    assert failed == {
        ("charge", 2),
        ("charge", 9),
        ("sms", 2),
        ("sms", 7),
        ("sms", 9),
    }


# -- a lookup that cannot read the payload, and resolving rejected deliveries ----------------------


class _LookupRefusesPayload(Charge):
    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        raise Quarantine("invalid_payload", "amount must be a positive integer")


def test_a_redrive_whose_lookup_cannot_read_the_payload_says_so_and_moves_nothing(
    store: PostgresStore, db: Db
) -> None:
    park(store, delivery("op-1"), intent=True)

    report = redrive(store, _LookupRefusesPayload()).run(RedriveFilter(), deliveries=False)

    (result,) = report.rows
    assert result.to is None
    assert "the lookup cannot read the payload (invalid_payload: amount must be" in result.note
    assert row_state(db, "op-1") == ("unknown", 1, 1)


def test_resolving_closes_each_open_delivery_once_and_never_a_redriven_one(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("op-1")])
    store.inbox.ingest([delivery("op-1", body="changed")])  # a conflict
    store.inbox.ingest([Rejection(subscription="orders", reason="body_not_json: x", body=b"{",
                            tenant_id="acme", operation_id="op-2")])  # fmt: skip
    (conflict,), (quarantined,) = db.execute(
        "SELECT id FROM rejected_delivery ORDER BY id"
    ).fetchall()
    assert store.operator.close_rejected(
        quarantined, outcome=Decision.NEW, actor="a", reason="redriven"
    )

    first = resolve(
        store.operator, RejectionFilter(tenant_id="acme"), actor="bob", reason="told them"
    )
    again = resolve(
        store.operator, RejectionFilter(ids=(conflict, quarantined)), actor="eve", reason="twice"
    )

    assert [r.id for r in first.resolved] == [conflict]  # the redriven one is closed already
    assert again.resolved == []
    assert [i for i, _ in again.not_open] == [conflict, quarantined]
    assert again.not_open[0][1].startswith("already resolved by bob at ")
    assert again.not_open[1][1].startswith("already closed by a redrive (a, ")
    assert db.execute(
        "SELECT resolved_by, resolution_reason, redriven_by FROM rejected_delivery ORDER BY id"
    ).fetchall() == [("bob", "told them", None), (None, None, "a")]
    # A quarantined delivery a person resolved is not closed again by a late redrive, and a
    # resolution always names who and why.
    store.inbox.ingest([Rejection(subscription="orders", reason="body_not_json: x", body=b"{",
                            tenant_id="acme", operation_id="op-3")])  # fmt: skip
    (given_up,) = db.execute("SELECT max(id) FROM rejected_delivery").fetchone()
    resolve(store.operator, RejectionFilter(ids=(given_up,)), actor="bob", reason="garbage")
    assert not store.operator.close_rejected(
        given_up, outcome=Decision.NEW, actor="a", reason="late"
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("UPDATE rejected_delivery SET resolved_by = NULL WHERE id = %s", (conflict,))
