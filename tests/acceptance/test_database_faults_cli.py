"""Every command meets a database it cannot use the same way: one line naming the cause and the
URL without its password, and the exit code :mod:`bridge.cli` documents for that fault.

The faults are real: a port nothing listens on, a database name the server does not have, a
database with no schema, and a role without grants (assumed with ``-c role=...``). Each command
runs as a subprocess, as an operator would run it, with the arguments it needs to reach the
database.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

from bridge.database import DATABASE_URL_ENV
from bridge.handlers import Context, UnfencedHandler
from bridge.identity import IDENTITY_KEY_ENV
from tests.support.postgres import create_database, drop_database, unique_name, with_dbname

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.acceptance.test_database_faults_cli"
PASSWORD = "s3cret-pw"

CONFIG = f"""
[jobs.sms]
handler = "{HERE}:Sms"
target_class = "D"
owner = "messaging"

[subscriptions.orders]
source = "sqs"
queue_url = "http://127.0.0.1:9/queue/orders"
job_types = ["sms"]

[subscriptions.orders.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/id"
job_type = "attribute:type"
payload = "body:/data"

[subscriptions.mirror]
source = "sqs"
mode = "shadow"
queue_url = "http://127.0.0.1:9/queue/mirror"
job_types = ["sms"]

[subscriptions.mirror.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/id"
job_type = "attribute:type"
payload = "body:/data"
"""


class Sms(UnfencedHandler):
    def call(self, ctx: Context) -> None:
        return None


#: every command that uses the database, with the arguments that bring it to the database
COMMANDS: dict[str, list[str]] = {
    "run": ["run", "--config", "{config}"],
    "console": ["console", "--config", "{config}", "--port", "{port}"],
    "check": ["check", "--config", "{config}"],
    "status": ["status"],
    "inspect": ["inspect", "tenant-1", "operation-1"],
    "redrive": ["redrive", "--config", "{config}", "--reason", "fault test"],
    "resend": ["resend", "--reason", "fault test"],
    "resolve": ["resolve", "--reason", "fault test", "--kind", "conflict"],
    "rate-wait list": ["rate-wait", "list"],
    "rate-wait clear": ["rate-wait", "clear", "--job-type", "sms", "--reason", "fault test"],
    "sweep": ["sweep"],
    "purge": ["purge", "--older-than", "90d"],
    "erase": ["erase", "--tenant", "tenant-1", "--reason", "fault test"],
    "shadow report": ["shadow", "report", "--config", "{config}", "--effects", "{effects}"],
    "shadow clear": ["shadow", "clear", "--subscription", "mirror"],
    "identity status": ["identity", "status"],
    "identity rotate": ["identity", "rotate", "--reason", "fault test"],
    "migrate": ["migrate"],
}

#: fault -> exit code (bridge.cli)
UNREACHABLE, MISNAMED, UNMIGRATED, NO_GRANTS = "unreachable", "misnamed", "unmigrated", "grants"
EXIT = {UNREACHABLE: 3, MISNAMED: 3, UNMIGRATED: 4, NO_GRANTS: 5}
CAUSE = {
    UNREACHABLE: "database unreachable: ",
    MISNAMED: "no such database: ",
    UNMIGRATED: "no fencebridge schema in this database",
    NO_GRANTS: "permission denied for table fencebridge_migration",
}
#: migrate needs CREATE where it makes the schema; what a command reads it never gets to
MIGRATE_NO_GRANTS = "lacks CREATE on schema public"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "bridge.toml"
    config.write_text(CONFIG)
    effects = tmp_path / "effects.jsonl"
    effects.write_text("")
    return {"config": str(config), "effects": str(effects), "port": str(free_port())}


@pytest.fixture
def unmigrated(pg_admin_url: str) -> Iterator[str]:
    name = unique_name("fb_unmigrated")
    url = create_database(pg_admin_url, name)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def ungranted(db_url: str) -> Iterator[str]:
    """The test's migrated database, as a role that holds no grant on it."""
    role = f"fb_nogrant_{secrets.token_hex(4)}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        yield conninfo.make_conninfo(db_url, options=f"-c role={role}")
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def fault_url(fault: str, request: pytest.FixtureRequest, admin: str) -> str:
    if fault == UNREACHABLE:
        return f"postgresql://fencebridge:{PASSWORD}@127.0.0.1:{free_port()}/payments"
    if fault == MISNAMED:
        return with_dbname(admin, unique_name("fb_misnamed"))
    if fault == UNMIGRATED:
        url: str = request.getfixturevalue("unmigrated")
        return url
    return request.getfixturevalue("ungranted")


def run_command(command: str, url: str, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = url
    env[IDENTITY_KEY_ENV] = "fault-test-identity-key-0123456789"
    env["FENCEBRIDGE_CONSOLE_TOKENS"] = "ops:operator:fault-test-console-token-0123456789"
    argv = [a.format(**files) for a in COMMANDS[command]]
    return subprocess.run(
        [sys.executable, "-m", "bridge", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def expected_faults(command: str) -> list[str]:
    # migrate makes the schema: an unmigrated database is its job, not a fault
    if command == "migrate":
        return [UNREACHABLE, MISNAMED, NO_GRANTS]
    return [UNREACHABLE, MISNAMED, UNMIGRATED, NO_GRANTS]


#: the cases of the fast tier: `run` meets every fault there (each case starts an interpreter,
#: about 2 s on two loaded cores); every other command's in `make test-all`
FAST_COMMANDS = ("run",)

CASES = [
    pytest.param(
        command,
        fault,
        id=f"{command}-{fault}".replace(" ", "-"),
        marks=() if command in FAST_COMMANDS else pytest.mark.slow,
    )
    for command in COMMANDS
    for fault in expected_faults(command)
]


@pytest.mark.promise("database-fault-exit")
@pytest.mark.parametrize(("command", "fault"), CASES)
def test_a_database_fault_ends_the_command_in_one_line_and_its_exit_code(
    command: str,
    fault: str,
    files: dict[str, str],
    pg_admin_url: str,
    request: pytest.FixtureRequest,
) -> None:
    url = fault_url(fault, request, pg_admin_url)
    done = run_command(command, url, files)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT[fault], done.stderr
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"fencebridge {command.split(maxsplit=1)[0]}: "), line
    cause = MIGRATE_NO_GRANTS if (command, fault) == ("migrate", NO_GRANTS) else CAUSE[fault]
    assert cause in line, line
    if fault == UNREACHABLE:
        assert "postgresql://fencebridge@127.0.0.1:" in line, line
    else:
        assert conninfo.conninfo_to_dict(url)["dbname"] in line, line
    assert PASSWORD not in done.stderr + done.stdout
    assert done.stdout == ""
