"""``fencebridge migrate`` as an operator runs it: a real process, a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from bridge import sql
from bridge.database import DATABASE_URL_ENV
from tests.support.postgres import create_database, drop_database, unique_name


def fencebridge(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    if url is not None:
        env[DATABASE_URL_ENV] = url
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def empty_url(pg_admin_url: str) -> Iterator[str]:
    name = unique_name("fbt_cli")
    url = create_database(pg_admin_url, name)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.mark.slow
def test_migrate_applies_everything_then_nothing(empty_url: str) -> None:
    first = fencebridge("migrate", url=empty_url)
    assert first.returncode == 0, first.stderr
    latest = sql.migrations()[-1].version
    expected = [f"applied {m.version:04d}_{m.name}" for m in sql.migrations()]
    assert first.stdout.splitlines() == [*expected, f"schema version {latest}"]
    assert first.stderr == ""
    with psycopg.connect(empty_url) as conn:
        versions = conn.execute("SELECT version FROM fencebridge_migration ORDER BY 1").fetchall()
    assert versions == [(m.version,) for m in sql.migrations()]

    second = fencebridge("migrate", url=empty_url)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["nothing to apply", f"schema version {latest}"]


@pytest.mark.slow
def test_migrate_takes_the_url_from_a_flag(empty_url: str) -> None:
    done = fencebridge("migrate", "--database-url", empty_url, url=None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("applied 0001_")


@pytest.mark.slow
def test_unreachable_database_exits_3_with_a_clear_message() -> None:
    url = "postgresql://fencebridge@127.0.0.1:1/nowhere?connect_timeout=5"  # nothing listens
    failed = fencebridge("migrate", url=url)
    assert failed.returncode == 3
    assert failed.stdout == ""
    assert failed.stderr.startswith("fencebridge migrate: database unreachable: ")
    assert "(postgresql://fencebridge@127.0.0.1:1/nowhere?connect_timeout=5)" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert len(failed.stderr.splitlines()) == 1


@pytest.mark.slow
def test_no_database_configured_exits_1_naming_the_variable() -> None:
    failed = fencebridge("migrate", url=None)
    assert failed.returncode == 1
    assert DATABASE_URL_ENV in failed.stderr
    assert "--database-url" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.mark.slow
def test_a_malformed_url_exits_1_without_a_traceback() -> None:
    failed = fencebridge("migrate", url="postgresql://[not a url")
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    assert failed.stderr.startswith("fencebridge migrate: ")
    assert "not a valid libpq URL" in failed.stderr


@pytest.mark.slow
def test_a_malformed_url_never_echoes_its_password() -> None:
    failed = fencebridge("migrate", url="postgresql://bridge:s3cret-pw@[bad/db")
    assert failed.returncode == 1
    assert "not a valid libpq URL" in failed.stderr
    assert "s3cret-pw" not in failed.stderr + failed.stdout
