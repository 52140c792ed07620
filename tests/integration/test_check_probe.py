"""``fencebridge check --probe``: controls 3, 4 and 8 decided by evidence that ran.

The probe passes on the shipped statements and adapters, and each of the three controls fails
on its own evidence when the thing it guards is broken on purpose: a claim that does not lock
(or waits instead of skipping), a claim that does not advance the fence, a settlement without
the fence condition (all swapped in through the probe's statement seam), and an adapter that
acknowledges before the inbox commits (through its adapter seam). The probe works in a scratch
schema it drops afterwards; the live schema's rows are left as they were.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from bridge import sql
from bridge.adapters import sources
from bridge.adapters.sources import ProbedAcks, SourceAdapter
from bridge.config import BridgeConfig, SubscriptionConfig, load_config
from bridge.errors import FenceBridgeError
from bridge.ingest.inbox import Inbox
from bridge.operator import probe
from bridge.operator.brokers import BrokerLook
from bridge.operator.check import Report, evaluate, read_database
from bridge.store import PostgresStore
from bridge.types import Delivery, RawDelivery, TargetClass
from tests.acceptance.test_cli_check import RETENTION
from tests.acceptance.test_cli_check import config as check_config
from tests.support.postgres import unique_name

PUBSUB = (
    "[subscriptions.events]\n"
    'source = "pubsub"\n'
    'subscription = "projects/acme/subscriptions/events"\n'
    'job_types = ["charge"]\n'
    "[subscriptions.events.decode]\n"
    'tenant_id = "attribute:tenant"\n'
    'operation_id = "body:/id"\n'
    'job_type = "attribute:type"\n'
    'payload = "body:/data"\n'
)


@pytest.fixture
def bridge_config(tmp_path: Path) -> BridgeConfig:
    """The passing configuration of the check's tests, with an SQS and a Pub/Sub subscription."""
    path = tmp_path / "bridge.toml"
    # purge after 40 days: past Pub/Sub's redelivery window, so control 9 holds too
    retention = RETENTION.replace("30", "40")
    path.write_text(check_config(retention=retention) + "\n" + PUBSUB)
    return load_config(str(path))


def claim_with(old: str, new: str) -> dict[str, LiteralString]:
    """The shipped claim with ``old`` replaced (it must be there), for the probe's seam."""
    text = sql.statement("claim")
    assert old in text
    return {probe.CLAIM: text.replace(old, new)}  # type: ignore[dict-item]


def settle_with(old: str, new: str) -> dict[str, LiteralString]:
    text = sql.statement("settle")
    assert old in text
    return {probe.SETTLE: text.replace(old, new)}  # type: ignore[dict-item]


def verdicts(report: Report, control: int) -> set[bool]:
    return {f.verdict.go for f in report.findings if f.control.number == control}


def live_rows(db: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT tenant_id, operation_id, state, fence, attempts, lease_expires_at"
        " FROM work_item ORDER BY tenant_id, operation_id"
    ).fetchall()


def probe_schemas(db: psycopg.Connection[Any]) -> list[str]:
    rows = db.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'fencebridge\\_probe\\_%'"
    ).fetchall()
    return [str(r[0]) for r in rows]


@pytest.mark.slow
def test_the_probe_holds_on_the_shipped_statements_and_adapters_and_leaves_live_rows_alone(
    db_url: str, db: psycopg.Connection[Any], store: PostgresStore, bridge_config: BridgeConfig
) -> None:
    store.inbox.ingest(
        [
            Delivery(
                tenant_id="acme",
                operation_id=f"order-{i}",
                subscription="orders",
                job_type="charge",
                target_class=TargetClass.C,
                payload=b'{"amount": 1}',
            )
            for i in range(6)
        ]
    )
    # a live claim in flight: the probe must neither take it over nor settle it
    assert len(store.claims.claim("live-worker", 2, timedelta(minutes=5))) == 2
    before = live_rows(db)

    report = probe.run(db_url, bridge_config)

    assert report.claim.go, report.claim.ran
    assert "16 threads claimed 500 rows: 0 claimed twice" in report.claim.ran
    assert "a second claim took 5 others without waiting" in report.claim.ran
    assert report.fence.go, report.fence.ran
    assert "the stale settlement (fence 1) was refused" in report.fence.ran
    assert set(report.acks) == {"orders", "events"}
    assert report.acks["orders"].go, report.acks["orders"].ran
    assert "inbox commit failed (StoreError) -> DeleteMessageBatch x0" in report.acks["orders"].ran
    assert "commit succeeded -> DeleteMessageBatch x1" in report.acks["orders"].ran
    assert report.acks["events"].go, report.acks["events"].ran
    assert "commit succeeded -> ack/Acknowledge x2" in report.acks["events"].ran
    assert report.schema.startswith("fencebridge_probe_")
    assert probe_schemas(db) == []
    assert live_rows(db) == before

    # the brokers asked too (control 8 reads them as well): every control was executed
    looked = {name: BrokerLook() for name in bridge_config.subscriptions}
    checked = evaluate(bridge_config, read_database(db), report, brokers=looked)
    assert checked.go, [f.verdict.evidence for f in checked.no_go]
    assert checked.not_probed == []


@pytest.mark.slow
def test_a_claim_that_does_not_lock_lets_two_workers_claim_one_row(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    unlocked = claim_with("FOR UPDATE SKIP LOCKED", "")
    report = probe.run(db_url, bridge_config, statements=unlocked)
    assert not report.claim.go
    assert "5 row(s) an open claim held were claimed again by another" in report.claim.ran
    checked = evaluate(bridge_config, read_database(db), report)
    assert verdicts(checked, 3) == {False}
    assert probe_schemas(db) == []


@pytest.mark.slow
def test_a_claim_that_waits_for_locked_rows_instead_of_skipping_them_is_no_go(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    report = probe.run(db_url, bridge_config, statements=claim_with("SKIP LOCKED", ""))
    assert not report.claim.go
    assert "a claim waited for the rows another open claim held" in report.claim.ran
    assert verdicts(evaluate(bridge_config, read_database(db), report), 3) == {False}


@pytest.mark.slow
def test_a_claim_without_its_state_condition_claims_settled_rows_again(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    any_state = claim_with("WHERE w.state = 'queued'", "WHERE true")
    report = probe.run(db_url, bridge_config, statements=any_state)
    assert not report.claim.go
    assert "of 500 row(s) claimed more than once" in report.claim.ran
    assert "the claims did not run out after" in report.claim.ran
    assert verdicts(evaluate(bridge_config, read_database(db), report), 3) == {False}


@pytest.mark.slow
def test_a_settlement_without_the_fence_condition_lets_a_stale_write_through(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    unfenced = settle_with("AND fence = %(fence)s\n", "")
    report = probe.run(db_url, bridge_config, statements=unfenced)
    assert not report.fence.go
    assert "the stale worker's settlement under fence 1 applied" in report.fence.ran
    checked = evaluate(bridge_config, read_database(db), report)
    assert verdicts(checked, 4) == {False}
    assert verdicts(checked, 3) == {True}


@pytest.mark.slow
def test_a_claim_that_does_not_advance_the_fence_is_no_go_on_fenced_writes(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    report = probe.run(db_url, bridge_config, statements=claim_with("fence = w.fence + 1,", ""))
    assert not report.fence.go
    assert "the takeover did not advance the fence (0 -> 0)" in report.fence.ran
    assert "the stale worker's settlement under fence 0 applied" in report.fence.ran
    assert verdicts(evaluate(bridge_config, read_database(db), report), 4) == {False}


class AckFirstQueue:
    """A broker stand-in for a consumer that acknowledges on receipt, before it writes."""

    def __init__(self) -> None:
        self.acked = 0

    def drive(self, sub: SubscriptionConfig, inbox: Inbox) -> ProbedAcks:
        raw = RawDelivery(subscription=sub.name, message_id="m-1", body=b"{}", attributes={})
        self.acked += 1  # acknowledged first ...
        try:
            inbox.write([raw])  # ... written after
        except FenceBridgeError as exc:
            return ProbedAcks(self.acked, "ack", type(exc).__name__)
        return ProbedAcks(self.acked, "ack")


def with_probe(hook: sources.AckProbe | None) -> probe.AdapterLookup:
    """The installed adapters, the SQS one with ``hook`` as its probe."""

    def lookup(source: str) -> SourceAdapter:
        found = sources.adapter(source)
        return replace(found, probe_ack_after_commit=hook) if source == "sqs" else found

    return lookup


@pytest.mark.slow
def test_an_adapter_that_acknowledges_before_the_commit_is_no_go(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    report = probe.run(db_url, bridge_config, adapter=with_probe(AckFirstQueue().drive))
    assert not report.acks["orders"].go
    assert "ack x1 although the inbox commit failed" in report.acks["orders"].ran
    assert report.acks["events"].go, report.acks["events"].ran
    checked = evaluate(bridge_config, read_database(db), report)
    # every job type the SQS subscription delivers fails control 8; nothing else fails
    assert {(f.job_type, f.control.number) for f in checked.no_go} == {
        ("charge", 8),
        ("ledger", 8),
        ("sms", 8),
    }


@pytest.mark.slow
def test_an_adapter_whose_probe_acknowledges_nothing_even_after_a_commit_is_no_go(
    db_url: str, bridge_config: BridgeConfig
) -> None:
    def idle(sub: SubscriptionConfig, inbox: Inbox) -> ProbedAcks:
        return ProbedAcks(0, "DeleteMessageBatch")

    report = probe.run(db_url, bridge_config, adapter=with_probe(idle))
    assert not report.acks["orders"].go
    assert "the probe did not drive the acknowledgement" in report.acks["orders"].ran


@pytest.mark.slow
def test_an_adapter_without_a_probe_is_no_go(db_url: str, bridge_config: BridgeConfig) -> None:
    report = probe.run(db_url, bridge_config, adapter=with_probe(None))
    assert report.acks["orders"] == probe.Evidence(
        False, "orders (sqs): adapter sqs offers no probe"
    )


def test_without_a_probe_the_three_controls_say_they_were_not_probed(
    db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    checked = evaluate(bridge_config, read_database(db))
    assert checked.go
    assert {f.control.number for f in checked.not_probed} == {3, 4, 8}
    for f in checked.not_probed:
        assert "not probed (`fencebridge check --probe` runs its evidence)" in f.verdict.evidence
    eight = next(f for f in checked.findings if f.control.number == 8)
    assert "acknowledged only after" not in eight.verdict.evidence


def test_a_probe_that_cannot_create_its_schema_fails_the_three_controls(
    db_url: str, db: psycopg.Connection[Any], bridge_config: BridgeConfig
) -> None:
    role = unique_name("fbt_no_create")
    db.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)))
    try:
        # a role without CREATE on the database (PUBLIC has CONNECT and TEMPORARY only)
        report = probe.run(make_conninfo(db_url, user=role), bridge_config)
    finally:
        db.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
    assert not report.claim.go
    assert report.claim.ran.startswith("the probe could not run: probe: create its scratch")
    assert report.fence == report.claim
    assert set(report.acks.values()) == {report.claim}
    checked = evaluate(bridge_config, read_database(db), report)
    assert {f.control.number for f in checked.no_go} == {3, 4, 8}
