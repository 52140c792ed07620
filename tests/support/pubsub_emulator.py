"""Google's Pub/Sub emulator for tests (see :mod:`bridge.demo.emulator`).

When the emulator is missing, tests that need it are skipped, except in CI (``CI=true``), where
a missing emulator fails the run instead of silently skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bridge.demo.emulator import (
    EMULATOR_ENV,
    EMULATOR_HOST_ENV,
    LAUNCHER,
    PROJECT,
    START_TIMEOUT,
    PubSubEmulator,
    find_launcher,
    free_port,
    with_emulator_host,
)

__all__ = [
    "EMULATOR_ENV",
    "EMULATOR_HOST_ENV",
    "LAUNCHER",
    "PROJECT",
    "START_TIMEOUT",
    "PubSubEmulator",
    "find_launcher",
    "free_port",
    "pubsub_emulator",
    "require_launcher",
    "with_emulator_host",
]


def require_launcher() -> Path:
    """The launcher; otherwise skip the test, or fail it under CI."""
    launcher, why = find_launcher()
    if launcher is not None:
        return launcher
    reason = f"Pub/Sub emulator unavailable: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def pubsub_emulator(launcher: Path) -> Iterator[PubSubEmulator]:
    emulator = PubSubEmulator(launcher)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()
