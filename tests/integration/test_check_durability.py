"""``check``'s control 10: what a failover can cost, read from the server's replication setup.

On a primary with a streaming standby: asynchronously, a class D job type whose subscription
acknowledges without waiting for the standby is no-go (a failover can lose its intent: a second
call), and the other classes say what they can lose; with ``wait_for_standby`` every job type is
go; under synchronous replication every one is go without it. A standalone server has no
failover to lose to.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from bridge.config import BridgeConfig, load_config
from bridge.operator.check import Report, evaluate, read_database
from bridge.store.migrate import migrate
from tests.acceptance.test_cli_check import config as check_config
from tests.support.replication import Mode, replicated_pair

pytestmark = pytest.mark.slow
WAIT = 'ack_mode = "after_inbox"\nwait_for_standby = true\n'


def bridge_config(tmp_path: Path, *, wait: bool) -> BridgeConfig:
    text = check_config()
    if wait:
        text = text.replace('source = "sqs"\n', f'source = "sqs"\n{WAIT}', 1)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return load_config(str(path))


def control_10(report: Report) -> dict[str, tuple[bool, str]]:
    return {
        f.job_type: (f.verdict.go, f.verdict.evidence)
        for f in report.findings
        if f.control.number == 10
    }


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_control_10_reads_the_replication_and_the_subscriptions_waits(
    tmp_path: Path, mode: Mode
) -> None:
    with replicated_pair(mode) as pair:
        pair.primary.execute("CREATE DATABASE fb")
        with psycopg.connect(pair.url("fb"), autocommit=True) as conn:
            migrate(conn)
            db = read_database(conn)
        plain = control_10(evaluate(bridge_config(tmp_path, wait=False), db))
        waiting = control_10(evaluate(bridge_config(tmp_path, wait=True), db))
    assert db.standbys == 1
    if mode == "sync":
        assert {go for go, _ in plain.values()} == {True}
        assert "synchronous replication" in plain["sms"][1]
    else:
        assert plain["sms"][0] is False
        assert "class D intents (a second call)" in plain["sms"][1]
        assert plain["ledger"][0] is True
        assert "can lose acknowledged deliveries of orders" in plain["ledger"][1]
    assert {go for go, _ in waiting.values()} == {True}


def test_a_standalone_server_has_no_failover_to_lose_to(tmp_path: Path, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        db = read_database(conn)
    found = control_10(evaluate(bridge_config(tmp_path, wait=False), db))
    assert {go for go, _ in found.values()} == {True}
    assert "no standby streams" in found["sms"][1]
