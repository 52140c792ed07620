"""`fencebridge demo`, the README's first command, as a newcomer runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.pubsub_emulator import require_launcher


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _summary(stdout: str) -> dict[str, int]:
    rows = re.findall(r"^\s*(\S.*?)\s{2,}(\d+)$", stdout, re.MULTILINE)
    return {name.strip(): int(value) for name, value in rows}


def _assert_protocol_held(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    summary = _summary(result.stdout)
    assert summary["deliveries published"] == 27
    assert summary["new operations"] == 22
    assert summary["replays (nothing new)"] == 3
    assert summary["conflicts (rejected, nothing changed)"] == 1
    assert summary["quarantined (undecodable, kept with reason)"] == 1
    assert summary["stale writes fenced out"] >= 1
    assert summary["takeovers of an expired lease"] >= 1
    assert summary["charges in the provider's ledger"] == summary["work rows succeeded"] == 21
    assert "every operation charged exactly once" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_demo_shows_the_protocol_on_sqs() -> None:
    _assert_protocol_held(_demo())


@pytest.mark.slow
def test_the_demo_shows_the_protocol_on_pubsub() -> None:
    require_launcher()
    _assert_protocol_held(_demo("--broker", "pubsub"))


def test_the_pubsub_demo_says_how_to_get_the_emulator_when_it_is_missing() -> None:
    result = _demo("--broker", "pubsub", env={"FENCEBRIDGE_PUBSUB_EMULATOR": "/nonexistent"})
    assert result.returncode == 1
    assert "gcloud components install pubsub-emulator" in result.stderr
    assert "Traceback" not in result.stderr
