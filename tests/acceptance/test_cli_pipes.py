"""A command whose output goes into a pipe that its reader has closed, as in ``| head -1``.

One test runs ``python -m bridge``, the other the ``fencebridge`` script the package installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.database import DATABASE_URL_ENV
from bridge.identity import IDENTITY_KEY_ENV
from bridge.store import PostgresStore
from bridge.types import Delivery, TargetClass

ROOT = Path(__file__).resolve().parents[2]
STATUS = [sys.executable, "-m", "bridge", "status", "--json"]
SCRIPT = str(Path(sys.executable).with_name("fencebridge"))


def environment(db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    return {**env, DATABASE_URL_ENV: db_url, IDENTITY_KEY_ENV: "pipes-acceptance-identity-key"}


def some_work(store: PostgresStore) -> None:
    store.inbox.ingest(
        [
            Delivery(
                tenant_id=f"tenant-{n}",
                operation_id="op",
                subscription="orders",
                job_type="charge",
                target_class=TargetClass.C,
                payload=b"{}",
            )
            for n in range(3)
        ]
    )


@pytest.mark.slow
def test_status_into_a_closed_pipe_exits_141_without_a_traceback(
    db_url: str, store: PostgresStore
) -> None:
    some_work(store)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes its first byte
    try:
        done = subprocess.run(
            STATUS,
            env=environment(db_url),
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.slow
def test_status_piped_into_head_prints_its_first_line_only(
    db_url: str, store: PostgresStore
) -> None:
    some_work(store)
    status = subprocess.Popen(
        [SCRIPT, "status", "--json"],
        env=environment(db_url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert status.stdout is not None
    head = subprocess.run(
        ["head", "-1"], stdin=status.stdout, capture_output=True, text=True, timeout=120, check=True
    )
    status.stdout.close()
    _, errors = status.communicate(timeout=120)
    assert head.stdout == "{\n"
    assert status.returncode in (0, 141)  # 141 when head was gone before the last write
    assert errors == ""
