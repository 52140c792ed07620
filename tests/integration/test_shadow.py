"""Shadow subscriptions on PostgreSQL: a copy of the stream recorded and decided as the inbox
decides, apart from the work rows, so that nothing can claim it; erasure reaches it."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.cli import main
from bridge.decode import RawDelivery
from bridge.errors import StoreError
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.inbox import Inbox
from bridge.shadow import Effect, ShadowWrites, compare
from bridge.store import PostgresStore
from bridge.types import Decision, Delivery, Key, Rejection
from tests.support.deliveries import delivery

Db = psycopg.Connection[tuple[Any, ...]]
LEASE = timedelta(seconds=30)


def shadowed(op: str, tenant: str = "t1", payload: bytes | None = None) -> Delivery:
    return dataclasses.replace(
        delivery(op, tenant=tenant, payload=payload, subscription="orders-shadow"),
        broker_message_id=f"m-{op}",
    )


def test_a_shadow_batch_is_decided_as_the_inbox_decides_and_nothing_is_claimable(
    store: PostgresStore, db: Db
) -> None:
    batch: list[Delivery | Rejection] = [
        shadowed("a"),
        shadowed("a"),
        shadowed("b"),
        shadowed("a", payload=b'{"other": 1}'),
        shadowed("a", tenant="t2"),  # the same operation id, another tenant
        Rejection(subscription="orders-shadow", reason="missing operation_id", job_type="refund"),
    ]
    results = store.ingest_shadow(batch)
    again = store.ingest_shadow([shadowed("b"), shadowed("b", payload=b"{}")])

    assert [(r.decision, r.key) for r in results] == [
        (Decision.NEW, Key("t1", "a")),
        (Decision.REPLAY, Key("t1", "a")),
        (Decision.NEW, Key("t1", "b")),
        (Decision.CONFLICT, Key("t1", "a")),
        (Decision.NEW, Key("t2", "a")),
        (Decision.QUARANTINED, None),
    ]
    assert [r.decision for r in again] == [Decision.REPLAY, Decision.CONFLICT]
    assert store.claim("w1", 100, LEASE) == []
    for table in ("work_item", "payload", "rejected_delivery"):
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    assert sorted(
        db.execute("SELECT decision, count(*) FROM shadow_delivery GROUP BY 1").fetchall()
    ) == [("conflict", 2), ("new", 3), ("quarantined", 1), ("replay", 2)]
    assert db.execute("SELECT count(*) FROM shadow_operation").fetchone() == (3,)
    decisions = store.shadow_decisions(["orders-shadow"])
    assert sorted(decisions, key=str) == sorted(
        [("refund", "new", 3), ("refund", "replay", 2), ("refund", "conflict", 2),
         ("refund", "quarantined", 1)],
        key=str,
    )  # fmt: skip
    seen = store.shadow_operations(["orders-shadow"])
    assert {(s.key, s.payload_hash) for s in seen} == {
        (Key("t1", "a"), shadowed("a").payload_hash),
        (Key("t1", "b"), shadowed("b").payload_hash),
        (Key("t2", "a"), shadowed("a").payload_hash),
    }


def test_a_shadow_inbox_ignores_the_backlog_quota_and_writes_nothing_claimable(
    store: PostgresStore,
) -> None:
    inbox = Inbox(ShadowWrites(store), lambda r: shadowed(r.message_id or ""))
    raws = [
        RawDelivery(subscription="orders-shadow", message_id=op, body=b"{}", attributes={})
        for op in ("a", "b", "a")
    ]
    outcomes = inbox.admit(raws, quota=1)
    assert [getattr(o, "decision", None) for o in outcomes] == [
        Decision.NEW,
        Decision.NEW,
        Decision.REPLAY,
    ]
    # a shadow NEW is not work: not even a targeted claim finds a row
    assert store.claim_keys("w1", [Key("t1", "a"), Key("t1", "b")], LEASE) == []


def test_a_live_row_and_a_shadow_record_of_the_same_operation_stay_apart(
    store: PostgresStore, db: Db
) -> None:
    store.ingest([delivery("a")])
    (shadow,) = store.ingest_shadow([shadowed("a", payload=b'{"other": 1}')])
    assert shadow.decision is Decision.NEW  # its own record: the live row is not consulted
    (claim,) = store.claim("w1", 10, LEASE)
    assert claim.key == Key("t1", "a")
    assert claim.payload == delivery("a").payload


def test_erasing_a_tenant_erases_what_shadow_subscriptions_recorded_of_it(
    store: PostgresStore, db: Db
) -> None:
    hasher = IdentityHasher(b"shadow-test-identity-key-01234567")
    keyring.attach(store, hasher, used_by="test")
    store.ingest_shadow([shadowed("a"), shadowed("b"), shadowed("a", tenant="t2")])
    store.erase("t1", tenant_hash=hasher.tenant("t1"), actor="dpo", reason="DSR-9")
    assert db.execute("SELECT DISTINCT tenant_id FROM shadow_operation").fetchall() == [("t2",)]
    assert db.execute("SELECT DISTINCT tenant_id FROM shadow_delivery").fetchall() == [("t2",)]
    assert store.shadow_clear("orders-shadow") == (1, 1)
    assert db.execute("SELECT count(*) FROM shadow_delivery").fetchone() == (0,)


def test_the_report_reads_an_effect_log_kept_as_a_view_of_the_database(
    store: PostgresStore,
    db: Db,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A view without the optional payload_hash column: applied twice and never applied are
    still found; a payload difference cannot be told, and the report says for how many."""
    store.ingest_shadow([shadowed("a"), shadowed("b"), shadowed("c"), shadowed("a")])
    db.execute("CREATE SCHEMA legacy")
    db.execute(
        "CREATE TABLE legacy.refunds_applied (tenant_id text, refund_id text, at timestamptz)"
    )
    db.execute(
        "INSERT INTO legacy.refunds_applied VALUES ('t1', 'a', now()), ('t1', 'a', now()),"
        " ('t1', 'b', now())"
    )
    db.execute(
        "CREATE VIEW legacy.effects AS SELECT tenant_id AS tenant, refund_id AS operation,"
        " at AS applied_at FROM legacy.refunds_applied"
    )
    config = tmp_path / "bridge.toml"
    config.write_text(SHADOW_CONFIG, encoding="utf-8")
    monkeypatch.setenv(IDENTITY_KEY_ENV, "shadow-report-test-identity-key-0123")
    db_url = db.info.dsn
    base = ["shadow", "report", "--config", str(config), "--database-url", db_url]

    assert main([*base, "--effects-table", "legacy.effects", "--json", "--reveal"]) == 0
    document = json.loads(capsys.readouterr().out)
    refund = document["job_types"]["refund"]
    assert (refund["deliveries"], refund["operations"], refund["replays"]) == (4, 3, 1)
    assert refund["applied_more_than_once"] == [{"tenant": "t1", "operation": "a", "times": 2}]
    assert refund["never_applied"] == [{"tenant": "t1", "operation": "c"}]
    assert refund["applied_with_other_payload"] == []
    assert document["effects_without_hash"] == 3

    assert main([*base, "--effects-table", "legacy.effects"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == [
        "job", "type", "deliveries", "operations", "replays", "conflicts", "undecodable",
        "applied", ">1", "other", "payload", "never", "applied",
    ]  # fmt: skip
    assert out.splitlines()[2].split() == ["refund", "4", "3", "1", "0", "0", "1", "0", "1"]
    assert "refund: never applied: tenant t_" in out
    assert " c " not in out

    assert main([*base, "--effects-table", "legacy.missing"]) == 1
    assert "no table or view 'legacy.missing'" in capsys.readouterr().err
    assert main([*base, "--effects-table", "a.b.c"]) == 1
    assert "named table or schema.table, not 'a.b.c'" in capsys.readouterr().err


SHADOW_CONFIG = """\
[jobs.refund]
handler = "tests.support.handlers:RecordEffect"
target_class = "A"

[subscriptions.orders-shadow]
source = "sqs"
mode = "shadow"
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-shadow"
job_types = ["refund"]

[subscriptions.orders-shadow.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:refund"
"""


def test_a_shadow_backlog_written_by_two_consumers_at_once_decides_each_operation_once(
    store: PostgresStore, db: Db
) -> None:
    """1,200 operations over three tenants (colliding ids), 300 published twice, 40 again with
    another payload and 12 undecodable, split between two consumers writing at once in
    overlapping batches (a redelivery reaches the other consumer), one batch of which fails and
    is delivered again: every operation is new exactly once, and the report's comparison names
    what an existing system that applied every copy did."""
    rng = random.Random(1200)
    keys = [Key(t, f"op-{i}") for t in ("t1", "t2", "t3") for i in range(400)]
    twice = set(rng.sample(keys, 300))
    changed = set(rng.sample(sorted(twice, key=str), 40))
    copies: list[Delivery | Rejection] = [shadowed(k.operation_id, k.tenant_id) for k in keys]
    copies += [
        shadowed(k.operation_id, k.tenant_id, payload=b'{"changed": 1}' if k in changed else None)
        for k in twice
    ]
    copies += [
        Rejection(subscription="orders-shadow", reason="missing operation_id", job_type="refund")
        for _ in range(12)
    ]
    rng.shuffle(copies)
    batches = [copies[i : i + 10] for i in range(0, len(copies), 10)]

    decided: list[tuple[Delivery | Rejection, Decision]] = []
    failed_once: list[int] = []
    lock = threading.Lock()

    failures: list[BaseException] = []

    def consumer(mine: list[list[Delivery | Rejection]]) -> None:
        try:
            consume(mine)
        except BaseException as exc:  # noqa: BLE001  (reported below, never lost)
            failures.append(exc)

    def consume(mine: list[list[Delivery | Rejection]]) -> None:
        for n, batch in enumerate(mine):
            if n == 3 and not failed_once:
                failed_once.append(n)
                broken = [*batch, shadowed("x", payload=b"1"), shadowed("x", payload=b"1")]
                # a batch whose transaction fails (a key the statement cannot write): not acked
                with pytest.raises(StoreError, match="shadow_operation_tenant_id_check"):
                    store.ingest_shadow([*broken, dataclasses.replace(shadowed("y"), tenant_id="")])
            results = store.ingest_shadow(batch)  # the broker hands it over again
            with lock:
                decided.extend((c, r.decision) for c, r in zip(batch, results, strict=True))

    halves = [batches[0::2], batches[1::2]]
    threads = [threading.Thread(target=consumer, args=(h,)) for h in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert failed_once

    assert len(decided) == len(copies) == 1512
    new = Counter(c.key for c, d in decided if isinstance(c, Delivery) and d is Decision.NEW)
    assert set(new) == set(keys)
    assert set(new.values()) == {1}
    counts = Counter(d for _, d in decided)
    assert counts == {
        Decision.NEW: 1200,
        Decision.REPLAY: 260,
        Decision.CONFLICT: 40,
        Decision.QUARANTINED: 12,
    }
    assert db.execute("SELECT count(*) FROM shadow_delivery").fetchone() == (1512,)
    assert store.claim("w1", 10, LEASE) == []

    # an existing system that applied every decodable copy
    effects = [Effect(c.key, "t", c.payload_hash) for c in copies if isinstance(c, Delivery)]
    result = compare(
        store.shadow_decisions(["orders-shadow"]), store.shadow_operations(["orders-shadow"]),
        effects,
    )  # fmt: skip
    refund = result.job_types["refund"]
    assert (refund.operations, refund.replays, refund.conflicts, refund.undecodable) == (
        1200, 260, 40, 12,
    )  # fmt: skip
    assert set(refund.applied_more_than_once) == twice
    # the first payload seen decides which copy counts as the other one
    assert len(refund.applied_with_other_payload) == 40
    assert refund.never_applied == []
