"""Shadow subscriptions on PostgreSQL: a copy of the stream recorded and decided as the inbox
decides, apart from the work rows, so that nothing can claim it; erasure reaches it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import threading
import tracemalloc
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.cli import main
from bridge.errors import StoreError
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.ingest.shadow import ShadowWrites
from bridge.operator.purge import purge
from bridge.operator.shadow import Effect, compare, in_key_order
from bridge.store import PostgresStore
from bridge.types import Decision, Delivery, Key, RawDelivery, Rejection
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
    results = store.inbox.ingest_shadow(batch)
    again = store.inbox.ingest_shadow([shadowed("b"), shadowed("b", payload=b"{}")])

    assert [(r.decision, r.key) for r in results] == [
        (Decision.NEW, Key("t1", "a")),
        (Decision.REPLAY, Key("t1", "a")),
        (Decision.NEW, Key("t1", "b")),
        (Decision.CONFLICT, Key("t1", "a")),
        (Decision.NEW, Key("t2", "a")),
        (Decision.QUARANTINED, None),
    ]
    assert [r.decision for r in again] == [Decision.REPLAY, Decision.CONFLICT]
    assert store.claims.claim("w1", 100, LEASE) == []
    for table in ("work_item", "payload", "rejected_delivery"):
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    assert sorted(
        db.execute("SELECT decision, count(*) FROM shadow_delivery GROUP BY 1").fetchall()
    ) == [("conflict", 2), ("new", 3), ("quarantined", 1), ("replay", 2)]
    assert db.execute("SELECT count(*) FROM shadow_operation").fetchone() == (3,)
    decisions = store.shadow.decisions(["orders-shadow"])
    assert sorted(decisions, key=str) == sorted(
        [("refund", "new", 3), ("refund", "replay", 2), ("refund", "conflict", 2),
         ("refund", "quarantined", 1)],
        key=str,
    )  # fmt: skip
    seen = store.shadow.operations(["orders-shadow"])
    assert [(s.key, s.payload_hash) for s in seen] == [
        (Key("t1", "a"), shadowed("a").payload_hash),
        (Key("t1", "b"), shadowed("b").payload_hash),
        (Key("t2", "a"), shadowed("a").payload_hash),
    ]


def test_a_shadow_inbox_ignores_the_backlog_quota_and_writes_nothing_claimable(
    store: PostgresStore,
) -> None:
    inbox = Inbox(ShadowWrites(store.inbox), lambda r: shadowed(r.message_id or ""))
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
    assert store.claims.claim_keys("w1", [Key("t1", "a"), Key("t1", "b")], LEASE) == []


def test_a_live_row_and_a_shadow_record_of_the_same_operation_stay_apart(
    store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery("a")])
    (shadow,) = store.inbox.ingest_shadow([shadowed("a", payload=b'{"other": 1}')])
    assert shadow.decision is Decision.NEW  # its own record: the live row is not consulted
    (claim,) = store.claims.claim("w1", 10, LEASE)
    assert claim.key == Key("t1", "a")
    assert claim.payload == delivery("a").payload


def test_erasing_a_tenant_erases_what_shadow_subscriptions_recorded_of_it(
    store: PostgresStore, db: Db
) -> None:
    hasher = IdentityHasher(b"shadow-test-identity-key-01234567")
    keyring.attach(store.keys, hasher, used_by="test")
    store.inbox.ingest_shadow([shadowed("a"), shadowed("b"), shadowed("a", tenant="t2")])
    store.operator.erase("t1", tenant_hash=hasher.tenant("t1"), actor="dpo", reason="DSR-9")
    assert db.execute("SELECT DISTINCT tenant_id FROM shadow_operation").fetchall() == [("t2",)]
    assert db.execute("SELECT DISTINCT tenant_id FROM shadow_delivery").fetchall() == [("t2",)]
    assert store.shadow.clear("orders-shadow") == (1, 1)
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
    store.inbox.ingest_shadow([shadowed("a"), shadowed("b"), shadowed("c"), shadowed("a")])
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
                    store.inbox.ingest_shadow(
                        [*broken, dataclasses.replace(shadowed("y"), tenant_id="")]
                    )
            results = store.inbox.ingest_shadow(batch)  # the broker hands it over again
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
    assert store.claims.claim("w1", 10, LEASE) == []

    # an existing system that applied every decodable copy
    effects = [Effect(c.key, "t", c.payload_hash) for c in copies if isinstance(c, Delivery)]
    result = compare(
        store.shadow.decisions(["orders-shadow"]), store.shadow.operations(["orders-shadow"]),
        in_key_order(effects), limit=1000,
    )  # fmt: skip
    refund = result.job_types["refund"]
    assert (refund.operations, refund.replays, refund.conflicts, refund.undecodable) == (
        1200, 260, 40, 12,
    )  # fmt: skip
    assert {k for k, _ in refund.applied_more_than_once.first} == twice
    # the first payload seen decides which copy counts as the other one
    assert refund.applied_with_other_payload.total == 40
    assert refund.never_applied.total == 0


# -- the report at volume ------------------------------------------------------------------------

TWO_SHADOWS = """\
[jobs.refund]
handler = "tests.support.handlers:RecordEffect"
target_class = "A"
"""
for _name in ("small", "large"):
    TWO_SHADOWS += f"""
[subscriptions.{_name}]
source = "sqs"
mode = "shadow"
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/{_name}-shadow"
job_types = ["refund"]

[subscriptions.{_name}.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:refund"
"""


@dataclasses.dataclass
class Shadowed:
    """What one subscription's record and the existing system's log hold, and what the report
    must find in them."""

    effects: list[tuple[str, str, str, str | None]]
    expected: dict[str, int]
    first_twice: list[dict[str, Any]]


def shadow_and_effects(store: PostgresStore, subscription: str, n: int, seed: int) -> Shadowed:
    """``n`` operations over three tenants with colliding ids recorded by ``subscription``
    (a fifth delivered twice, one in thirty again with another payload, one in a hundred
    undecodable), and an effect log in which the existing system applied a tenth of them
    never, a seventh twice, one in twenty with another payload, and a fifth without recording
    a payload hash, with one effect in twenty of operations the shadow never saw."""
    rng = random.Random(seed)
    keys = [Key(f"t{i % 3}", f"op-{i // 3}") for i in range(n)]
    copies: list[Delivery | Rejection] = []
    for k in keys:
        first = dataclasses.replace(
            shadowed(k.operation_id, k.tenant_id), subscription=subscription
        )
        copies.append(first)
        if rng.random() < 0.2:  # delivered again: another copy of the same message
            copies.append(dataclasses.replace(first))
        if rng.random() < 1 / 30:
            copies.append(dataclasses.replace(first, payload=b'{"changed": 1}'))
    copies += [
        Rejection(subscription=subscription, reason="missing operation_id", job_type="refund")
        for _ in range(n // 100)
    ]
    rng.shuffle(copies)
    for i in range(0, len(copies), 500):
        store.inbox.ingest_shadow(copies[i : i + 500])
    hashed = {k: shadowed(k.operation_id, k.tenant_id).payload_hash.hex() for k in keys}
    first_seen: dict[tuple[str, str], str] = {}
    replays = conflicts = 0
    for c in copies:  # written one batch after another: the first copy is the one recorded
        if not isinstance(c, Delivery):
            continue
        key = (c.tenant_id, c.operation_id)
        if key not in first_seen:
            first_seen[key] = c.payload_hash.hex()
        elif first_seen[key] == c.payload_hash.hex():
            replays += 1
        else:
            conflicts += 1
    other = hashlib.sha256(b"another payload").hexdigest()
    effects: list[tuple[str, str, str, str | None]] = []
    never = twice = unhashed = 0
    first_twice = []
    for k in sorted(keys, key=lambda k: (k.tenant_id, k.operation_id)):
        draw = rng.random()
        times = 0 if draw < 0.1 else 2 if draw < 0.1 + 1 / 7 else 1
        never, twice = never + (times == 0), twice + (times == 2)
        if times == 2 and len(first_twice) < 5:
            first_twice.append({"tenant": k.tenant_id, "operation": k.operation_id, "times": 2})
        for _ in range(times):
            digest: str | None = hashed[k]
            if rng.random() < 0.05:
                digest = other
            elif rng.random() < 0.2:
                digest, unhashed = None, unhashed + 1
            effects.append((k.tenant_id, k.operation_id, "2026-12-01T00:00:00Z", digest))
    unseen = [(f"t{i % 3}", f"gone-{i}", "2026-11-01T00:00:00Z", None) for i in range(n // 20)]
    effects += unseen
    rng.shuffle(effects)
    # another payload than the first one recorded (which may be the changed one)
    changed_ops = len({(t, o) for t, o, _, d in effects if d not in (None, first_seen.get((t, o)))})
    expected = {
        "operations": n,
        "never_applied": never,
        "applied_more_than_once": twice,
        "applied_with_other_payload": changed_ops,
        "effects_without_hash": unhashed,
        "effects_not_seen": len(unseen),
        "deliveries": len(copies),
        "replays": replays,
        "conflicts": conflicts,
        "undecodable": n // 100,
    }
    return Shadowed(effects, expected, first_twice)


def write_effects(db: Db, tmp_path: Path, name: str, shadowed: Shadowed, source: str) -> list[str]:
    """The log as a JSON Lines file or a table; the report's arguments that name it."""
    if source == "file":
        path = tmp_path / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for t, o, at, digest in shadowed.effects:
                entry = {"tenant": t, "operation": o, "applied_at": at}
                f.write(json.dumps(entry | ({"payload_hash": digest} if digest else {})) + "\n")
        return ["--effects", str(path)]
    db.execute("CREATE SCHEMA IF NOT EXISTS legacy")
    db.execute(
        f"CREATE TABLE legacy.{name} (tenant text, operation text, applied_at timestamptz,"
        " payload_hash text)"
    )
    with db.cursor().copy(f"COPY legacy.{name} FROM STDIN") as copy:
        for row in shadowed.effects:
            copy.write_row(row)
    return ["--effects-table", f"legacy.{name}"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["file", "table"])
def test_the_report_holds_a_page_of_the_record_and_a_run_of_the_log_whatever_their_size(  # noqa: PLR0917
    store: PostgresStore,
    db: Db,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
) -> None:
    """Two shadow subscriptions, of 2,000 and 8,000 operations (with replays, conflicts and
    undecodable deliveries), each set against its own effect log (applied twice, never, with
    another payload, without a hash, of operations never seen; in random order). The report's
    peak of traced memory is the same for both: it holds a page of each query and a run of a
    sorted log, never the record or the log (both made small here, so that these are many
    pages and runs). Reading everything, the larger report takes four times the memory."""
    monkeypatch.setattr("bridge.store.operator.SHADOW_PAGE_DEFAULT", 200, raising=False)
    monkeypatch.setattr("bridge.operator.shadow.SORT_RUN_DEFAULT", 2000, raising=False)
    sizes = {"small": 2000, "large": 8000}
    made = {name: shadow_and_effects(store, name, n, seed=n) for name, n in sizes.items()}
    logs = {name: write_effects(db, tmp_path, name, s, source) for name, s in made.items()}
    config = tmp_path / "bridge.toml"
    config.write_text(TWO_SHADOWS, encoding="utf-8")
    monkeypatch.setenv(IDENTITY_KEY_ENV, "shadow-report-test-identity-key-0123")
    base = ["shadow", "report", "--config", str(config), "--database-url", db.info.dsn]

    def report(name: str, *more: str) -> dict[str, Any]:
        assert main([*base, "--subscription", name, *logs[name], "--json", "--reveal", *more]) == 0
        document: dict[str, Any] = json.loads(capsys.readouterr().out)
        return document

    def peak(name: str) -> int:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        report(name)
        return tracemalloc.get_traced_memory()[1] - before

    report("small")  # imports and first-use caches, outside the measure
    tracemalloc.start()
    try:
        peaks = {name: peak(name) for name in sizes}
    finally:
        tracemalloc.stop()
    assert peaks["large"] < 1.5 * peaks["small"], peaks

    for name, shadowed_ in made.items():
        document = report(name, "--limit", "5")
        refund = document["job_types"]["refund"]
        expected = shadowed_.expected
        for count in ("deliveries", "operations", "replays", "conflicts", "undecodable"):
            assert refund[count] == expected[count], (count, refund, expected)
        assert refund["totals"] == {
            k: expected[k]
            for k in ("applied_more_than_once", "applied_with_other_payload", "never_applied")
        }
        assert refund["applied_more_than_once"] == shadowed_.first_twice
        assert len(refund["never_applied"]) == len(refund["applied_with_other_payload"]) == 5
        assert document["effects_not_seen"] == expected["effects_not_seen"]
        assert document["effects_without_hash"] == expected["effects_without_hash"]
        assert document["listed_per_finding"] == 5


# -- retention -----------------------------------------------------------------------------------


def test_purge_removes_what_shadow_subscriptions_recorded_before_its_cutoff_in_batches(
    store: PostgresStore, db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    """1,200 operations recorded 40 days ago (with replays, conflicts and undecodable copies
    then), 100 of them delivered again 5 days ago, and 100 operations first seen 5 days ago:
    a purge at 35 days, 150 rows a batch, removes every delivery received before the cutoff
    and every operation first seen before it that no kept delivery names; the rest stays, and
    the report still counts what stays."""
    rng = random.Random(35)
    old = [shadowed(f"op-{i}", f"t{i % 3}") for i in range(1200)]
    then: list[Delivery | Rejection] = [*old]
    then += [dataclasses.replace(d) for d in rng.sample(old, 200)]
    then += [dataclasses.replace(d, payload=b'{"changed": 1}') for d in rng.sample(old, 40)]
    then += [Rejection(subscription="orders-shadow", reason="missing operation_id")] * 12
    rng.shuffle(then)
    for i in range(0, len(then), 200):
        store.inbox.ingest_shadow(then[i : i + 200])
    db.execute("UPDATE shadow_delivery SET received_at = now() - interval '40 days'")
    db.execute("UPDATE shadow_operation SET first_seen_at = now() - interval '40 days'")
    again = rng.sample(old, 100)
    store.inbox.ingest_shadow([dataclasses.replace(d) for d in again])
    young = [shadowed(f"new-{i}") for i in range(100)]
    store.inbox.ingest_shadow(young)
    db.execute(
        "UPDATE shadow_delivery SET received_at = now() - interval '5 days'"
        " WHERE received_at > now() - interval '1 day'"
    )

    db_url = db.info.dsn
    assert main(["purge", "--older-than", "35d", "--dry-run", "--database-url", db_url]) == 0
    assert (
        "would purge 1452 shadow delivery record(s) and 1100 shadow operation record(s) older "
        "than 35d" in capsys.readouterr().out
    )
    report = purge(store.operator, timedelta(days=35), batch_size=150)

    assert report.removed.shadow_deliveries == 1452
    assert report.removed.shadow_operations == 1100
    assert report.batches == 10  # 1,452 deliveries at 150 a batch: the tenth is not full
    kept = {
        Key(t, o) for t, o in db.execute("SELECT tenant_id, operation_id FROM shadow_operation")
    }
    assert kept == {d.key for d in again} | {d.key for d in young}
    assert db.execute(
        "SELECT count(*), min(received_at) > now() - interval '35 days' FROM shadow_delivery"
    ).fetchone() == (200, True)
    decisions = {(j, d): n for j, d, n in store.shadow.decisions(["orders-shadow"])}
    assert decisions[("refund", "new")] == 100
    assert sum(decisions.values()) == 200  # the 100 again: replays, or conflicts
    assert main(["purge", "--older-than", "35d", "--database-url", db_url]) == 0
    assert "purged 0 shadow delivery record(s) and 0 shadow operation record(s) older than 35d" in (
        capsys.readouterr().out
    )
