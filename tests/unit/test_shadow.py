"""Shadow mode without a database: the configuration's rules, the effect log's format, and the
comparison (the record and the report are tested on PostgreSQL, brokers and processes in
``tests/integration/test_shadow.py`` and ``tests/acceptance/test_shadow_*.py``)."""

from __future__ import annotations

import hashlib
import random
import tempfile
from pathlib import Path

import pytest

from bridge.config import SubscriptionMode, parse_config
from bridge.errors import ConfigError, EffectLogError, StoreError
from bridge.operator.shadow import (
    Effect,
    Listing,
    compare,
    in_key_order,
    key_order,
    read_effect_file,
)
from bridge.store.records import SeenOperation
from bridge.types import Key
from tests.unit.test_config import BASE, PUBSUB, after, edit


def message(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="bridge.toml")
    return str(caught.value)


SHADOW_COPY = (
    BASE
    + """
[subscriptions.refunds_shadow]
source = "sqs"
mode = "shadow"
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/refunds-shadow"
job_types = ["refund"]

[subscriptions.refunds_shadow.decode]
tenant_id = "attribute:tenant_id"
operation_id = "body:/refund_request_id"
job_type = "value:refund"
"""
)


def test_a_subscription_is_live_unless_it_says_shadow() -> None:
    loaded = parse_config(SHADOW_COPY)
    assert loaded.subscriptions["refunds"].mode is SubscriptionMode.LIVE
    assert not loaded.subscriptions["refunds"].shadow
    assert loaded.subscriptions["refunds_shadow"].shadow


def test_a_shadow_subscription_cannot_wait_for_an_outcome() -> None:
    text = after(SHADOW_COPY, "[subscriptions.refunds_shadow]", 'ack_mode = "after_outcome"')
    assert "a shadow subscription has no outcome to wait for: only 'after_inbox'" in message(text)


def test_a_shadow_subscription_may_not_read_the_live_subscriptions_queue() -> None:
    text = edit(SHADOW_COPY, "123456789012/refunds-shadow", "123456789012/refunds")
    found = message(text)
    assert "subscriptions.refunds_shadow" in found
    assert "which the live subscription 'refunds' reads" in found
    copy_table = PUBSUB[PUBSUB.index("[subscriptions.sms]") :]
    pubsub = PUBSUB + copy_table.replace("[subscriptions.sms", "[subscriptions.sms_copy").replace(
        'source = "pubsub"', 'source = "pubsub"\nmode = "shadow"'
    )
    assert "which the live subscription 'sms' reads" in message(pubsub)
    copy = pubsub.replace(
        'subscription = "projects/p/subscriptions/sms"\njob_types = ["sms"]\n\n'
        "[subscriptions.sms_copy.decode]",
        'subscription = "projects/p/subscriptions/sms-copy"\njob_types = ["sms"]\n\n'
        "[subscriptions.sms_copy.decode]",
    )
    assert parse_config(copy).subscriptions["sms_copy"].shadow


def test_an_unknown_mode_is_refused() -> None:
    text = after(BASE, "[subscriptions.refunds]", 'mode = "dry"')
    assert "subscriptions.refunds.mode" in message(text)


# -- the effect log ----------------------------------------------------------------------------


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_an_effect_log_is_csv_or_json_lines_with_the_documented_columns(tmp_path: Path) -> None:
    csv_file = tmp_path / "effects.csv"
    csv_file.write_text(
        f"tenant,operation,applied_at,payload_hash\nt1,a,2026-01-01T00:00:00Z,{digest(b'x')}\n"
        "t1,b,2026-01-01T00:00:01Z,\n"
    )
    lines = tmp_path / "effects.jsonl"
    lines.write_text(
        '{"tenant": "t1", "operation": "a", "applied_at": "2026-01-01T00:00:00Z"}\n\n'
        f'{{"tenant": "t1", "operation": "b", "applied_at": 1, "payload_hash": "{digest(b"y")}"}}\n'
    )
    from_csv = list(read_effect_file(csv_file))
    assert [(e.key, e.payload_hash) for e in from_csv] == [
        (Key("t1", "a"), hashlib.sha256(b"x").digest()),
        (Key("t1", "b"), None),
    ]
    assert [e.key for e in read_effect_file(lines)] == [Key("t1", "a"), Key("t1", "b")]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("e.csv", "tenant,operation\nt1,a\n", "the header has no applied_at column"),
        ("e.csv", "tenant,operation,applied_at\nt1,,x\n", "e.csv:2: no operation"),
        ("e.jsonl", '{"tenant": "t1"\n', "e.jsonl:1: not JSON"),
        ("e.jsonl", "[1]\n", "e.jsonl:1: not a JSON object"),
        (
            "e.jsonl",
            '{"tenant": "t", "operation": "o", "applied_at": "x", "payload_hash": "abc"}\n',
            "e.jsonl:1: payload_hash is not a hex sha256",
        ),
        ("e.txt", "", "an effect log is a .csv, .jsonl or .ndjson file"),
    ],
)
def test_a_bad_effect_log_names_the_line_and_the_problem(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(EffectLogError, match=expected):
        list(read_effect_file(path))


def test_an_effect_log_that_is_not_utf8_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "effects.csv"
    path.write_bytes(b"tenant,operation,applied_at\nt1,caf\xe9,now\n")
    with pytest.raises(EffectLogError, match=r"effects.csv: not UTF-8 text \(invalid"):
        list(read_effect_file(path))


# -- the comparison ----------------------------------------------------------------------------


def test_the_comparison_names_what_the_existing_system_did_that_fencebridge_would_not(
    tmp_path: Path,
) -> None:
    first, other = b'{"amount": 5}', b'{"amount": 500}'
    seen = [
        SeenOperation(Key("t1", op), "refund", hashlib.sha256(first).digest())
        for op in ("once", "twice", "changed", "lost")
    ] + [SeenOperation(Key("t2", "once"), "sms", hashlib.sha256(first).digest())]
    log = tmp_path / "effects.jsonl"
    entries = [
        ("t1", "once", first),
        ("t1", "twice", first),
        ("t1", "twice", first),
        ("t1", "changed", first),
        ("t1", "changed", other),
        ("t2", "once", None),
        ("t9", "elsewhere", first),
    ]
    log.write_text(
        "".join(
            f'{{"tenant": "{t}", "operation": "{o}", "applied_at": "now"'
            + (f', "payload_hash": "{digest(b)}"' if b else "")
            + "}\n"
            for t, o, b in entries
        )
    )
    decisions = [("refund", "new", 4), ("refund", "replay", 1), ("refund", "conflict", 1),
                 (None, "quarantined", 1), ("sms", "new", 1)]  # fmt: skip

    result = compare(decisions, sorted(seen, key=lambda o: key_order(o.key)), in_key_order(
        read_effect_file(log)))  # fmt: skip

    refund = result.job_types["refund"]
    assert (refund.deliveries, refund.operations, refund.replays, refund.conflicts) == (6, 4, 1, 1)
    assert refund.applied_more_than_once == Listing(
        2, [(Key("t1", "changed"), 2), (Key("t1", "twice"), 2)]
    )
    assert refund.applied_with_other_payload == Listing(1, [(Key("t1", "changed"), 2)])
    assert refund.never_applied == Listing(1, [(Key("t1", "lost"), 0)])
    assert result.job_types["-"].undecodable == 1
    sms = result.job_types["sms"]
    assert (sms.operations, sms.applied_more_than_once, sms.never_applied) == (
        1, Listing(), Listing(),
    )  # fmt: skip
    assert result.effects_not_seen == 1
    assert result.effects_without_hash == 1


def test_the_comparison_lists_the_first_operations_of_a_finding_and_counts_them_all() -> None:
    h = hashlib.sha256(b"p").digest()
    seen = [SeenOperation(Key("t", f"op-{i:03}"), "refund", h) for i in range(250)]
    twice = [Effect(k, "now", h) for op in seen[:120] for k in (op.key, op.key)]
    result = compare([], seen, twice, limit=7)
    refund = result.job_types["refund"]
    assert refund.operations == 250
    assert refund.applied_more_than_once.total == 120
    assert refund.applied_more_than_once.first == [(Key("t", f"op-{i:03}"), 2) for i in range(7)]
    assert refund.never_applied.total == 130
    assert [k.operation_id for k, _ in refund.never_applied.first] == [
        f"op-{i:03}" for i in range(120, 127)
    ]
    assert result.limit == 7


def test_a_side_out_of_key_order_is_refused_rather_than_compared_wrongly() -> None:
    h = hashlib.sha256(b"p").digest()
    ops = [SeenOperation(Key("t", "b"), "j", h), SeenOperation(Key("t", "a"), "j", h)]
    with pytest.raises(StoreError, match="the shadow record is not in key order"):
        compare([], ops, [])
    twice = [SeenOperation(Key("t", "a"), "j", h)] * 2
    with pytest.raises(StoreError, match="the shadow record is not in key order"):
        compare([], twice, [])
    effects = [Effect(Key("u", "a"), "now"), Effect(Key("t", "a"), "now")]
    with pytest.raises(StoreError, match="the effect log is not in key order"):
        compare([], [], effects)


def test_an_effect_log_longer_than_a_run_is_sorted_in_runs_on_disk_and_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code point order (PostgreSQL's COLLATE "C"); runs written under TMPDIR, every file gone
    once the merge ends; more runs than the fan-in are merged in rounds."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = random.Random(7)
    names = ["a", "B", "é", "z", "ä", "Z", "a-1", "a_1", "\u20ac", "\U0001f600"]
    effects = [
        Effect(Key(rng.choice(names), rng.choice(names)), str(n), rng.choice([None, b"\x01" * 32]))
        for n in range(1_000)
    ]
    expected = sorted(effects, key=lambda e: (e.key.tenant_id, e.key.operation_id))
    assert list(in_key_order(effects)) == expected  # one run: in memory, in the order given

    def everything(e: Effect) -> tuple[str, str, str, bytes]:
        return (*key_order(e.key), e.applied_at, e.payload_hash or b"")

    sorted_on_disk = in_key_order(effects, run=30, fan_in=4)
    got = [next(sorted_on_disk)]
    (spilled,) = tmp_path.iterdir()
    assert len(list(spilled.iterdir())) <= 4  # 34 runs, merged four at a time
    got += sorted_on_disk
    assert [e.key for e in got] == [e.key for e in expected]
    assert sorted(got, key=everything) == sorted(effects, key=everything)
    assert list(tmp_path.iterdir()) == []
