"""One rendering per record: ``fencebridge inspect --json`` and the console's
``POST /api/v1/operation`` are the same view (:mod:`bridge.operator.views`), so they carry the
same fields with the same values; only the payload's digest is shown for each audience (the
CLI's plain, the console's keyed per tenant)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.database import DATABASE_URL_ENV
from bridge.identity import IDENTITY_KEY_ENV
from tests.integration.test_console_api import (
    OPERATOR,
    PAYLOAD,
    TENANTS,
    VIEWER,
    Console,
)
from tests.integration.test_console_api import console as console  # noqa: PLC0414  (fixture)

#: the key of the console tests' hasher (HASHER), so the CLI shows the same hashes
KEY = "console-api-integration-secret-0123"
#: fields whose value is shown per audience, not per record
PER_AUDIENCE = {"payload_hash"}


def cli_json(db_url: str, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    env[IDENTITY_KEY_ENV] = KEY
    done = subprocess.run(
        [sys.executable, "-m", "bridge", *args, "--json"],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def shared(value: Any) -> Any:
    """``value`` without the fields shown per audience."""
    if isinstance(value, dict):
        return {k: shared(v) for k, v in value.items() if k not in PER_AUDIENCE}
    if isinstance(value, list):
        return [shared(v) for v in value]
    return value


def fields(value: Any, path: str = "") -> set[str]:
    """Every field path of a document (list items merged)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            found |= {f"{path}{k}"} | fields(v, f"{path}{k}.")
    elif isinstance(value, list):
        for v in value:
            found |= fields(v, path + "[].")
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    "op",
    [
        "op-raw-0-0",  # succeeded, with a conflicting delivery and a payload view
        "op-raw-0-2",  # unknown, redriven (the lookup found it applied)
        "op-raw-0-3",  # quarantined by its handler
    ],
)
def test_the_cli_and_the_api_render_one_operation_alike(
    console: Console, db_url: str, op: str
) -> None:
    tenant = TENANTS[0]
    key = {"tenant_id": tenant, "operation_id": op}
    view = {**key, "reason": "INC-9: the views test"}
    assert console.call("POST", "/api/v1/payload", view, token=PAYLOAD)[0] == 200
    redrive = {**key, "reason": "INC-9", "dry_run": False, "states": ["unknown"]}
    assert console.call("POST", "/api/v1/redrive", redrive, token=OPERATOR)[0] == 200

    status, api = console.call("POST", "/api/v1/operation", key, token=VIEWER)
    cli = cli_json(db_url, "inspect", tenant, op)

    assert status == 200
    assert fields(api) <= fields(cli)
    assert fields(api) >= fields({k: v for k, v in cli.items() if k in api})
    assert shared(api) == shared({k: cli[k] for k in api})
    assert api["work_row"]["payload_hash"].startswith("p_")
    assert cli["work_row"]["payload_hash"].startswith("sha256:")
    assert api["payload_views"] != []
    assert [r["to_state"] for r in api["redrives"]] == (["succeeded"] if op == "op-raw-0-2" else [])


@pytest.mark.slow
def test_the_cli_and_the_api_render_the_status_alike(console: Console, db_url: str) -> None:
    status, api = console.call("GET", "/api/v1/status", token=VIEWER)
    cli = cli_json(db_url, "status")

    assert status == 200
    # an age, read a moment apart
    ages = api.pop("oldest_unknown_seconds"), cli.pop("oldest_unknown_seconds")
    assert 0 < ages[0] <= ages[1]
    assert api == {k: cli[k] for k in api}
    assert set(cli) - set(api) == {"waiting", "outbox"}
    assert api["rejected"] == {"conflict": 1, "quarantined": 1}
