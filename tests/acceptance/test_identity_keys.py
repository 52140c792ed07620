"""Two ``fencebridge run`` processes on one database with different identity keys: the second
refuses to start, saying which key the database expects; the operator commands refuse that key
too, ``fencebridge identity status`` tells the expected key without needing any, and after
``fencebridge identity rotate`` the second bridge starts with the first key as a previous one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.identity import IDENTITY_KEY_ENV, IDENTITY_PREVIOUS_KEYS_ENV, fingerprint, shown
from tests.support.bridge_process import (
    IDENTITY_KEY,
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
    fencebridge,
    free_port,
    run_to_exit,
)
from tests.support.sqs_server import SqsServer, sqs_server

OTHER_KEY = "another-deployments-identity-key-0000"


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.mark.slow
def test_a_second_bridge_with_another_key_refuses_to_start(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    config = SqsBridgeConfig(
        queue_url=moto.create_queue("keys"),
        endpoint_url=moto.endpoint,
        jobs={"record": Job("tests.support.handlers:RecordEffect", "A")},
    )
    with BridgeProcess.start(config, tmp_path, bridge_env(db_url)) as first:
        first.wait_ready()
        expected = f"key 1 (fingerprint {shown(fingerprint(IDENTITY_KEY.encode()))})"

        second = dataclasses.replace(config, health_port=free_port())
        refused = run_to_exit(
            second.write(tmp_path, "second.toml"), bridge_env(db_url, identity_key=OTHER_KEY)
        )
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "fencebridge run:" in refused.stderr
        assert f"it expects {expected}" in refused.stderr
        assert "the deployment's key" in refused.stderr
        assert "Traceback" not in refused.stdout + refused.stderr
        assert OTHER_KEY not in refused.stdout + refused.stderr
        assert first.returncode is None, "the first bridge keeps running"

        # Without a key, status shows what the database expects and says to reuse that key.
        status = fencebridge(bridge_env(db_url, identity_key=None), "identity", "status")
        assert status.returncode == 0, status.stderr
        assert shown(fingerprint(IDENTITY_KEY.encode())) in status.stdout
        assert f"{IDENTITY_KEY_ENV} is not set" in status.stdout
        assert "openssl" not in status.stdout
        # With the other key, the same command says it is not the current key, and fails.
        other_env = bridge_env(db_url, identity_key=OTHER_KEY)
        wrong = fencebridge(other_env, "identity", "status")
        assert wrong.returncode == 1
        assert "is not the current key (key 1)" in wrong.stdout
        # The false finding: a redrive under another key never gets to look anything up.
        config_file = tmp_path / "second.toml"
        for command in (
            ["status"],
            ["redrive", "--config", str(config_file), "--reason", "r", "--dry-run"],
        ):
            done = fencebridge(other_env, *command)
            assert done.returncode == 1, (command, done.stdout)
            assert f"it expects {expected}" in done.stderr
            assert done.stdout == ""

        # A rotation to the other key; the second bridge then starts, holding key 1 as well.
        rotate_env = {**other_env, IDENTITY_PREVIOUS_KEYS_ENV: IDENTITY_KEY}
        rotated = fencebridge(rotate_env, "identity", "rotate", "--reason", "CHG-1")
        assert rotated.returncode == 0, rotated.stderr
        assert "recorded key 2" in rotated.stdout
        with BridgeProcess.start(second, tmp_path, rotate_env) as restarted:
            restarted.wait_ready()
            assert restarted.terminate() == 0, restarted.logs()
        assert first.returncode is None, "a bridge started before the rotation keeps running"
        assert first.terminate() == 0, first.logs()
