"""Shared fixtures: a PostgreSQL server for the run, a migrated template, a database per test.

The server is the one named by ``FENCEBRIDGE_TEST_DATABASE_URL`` (any database on it; tests
create and drop their own), or else an embedded server started for this run.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge import embedded
from bridge.store import PostgresStore
from tests.support.alone_scheduling import ALONE_FILES, AloneTogether, file_of
from tests.support.postgres import (
    TEST_DATABASE_URL_ENV,
    database_from,
    migrated_template,
)
from tests.support.promises import PROMISES


def pytest_report_header(config: pytest.Config) -> str:
    source = os.environ.get(TEST_DATABASE_URL_ENV)
    return f"fencebridge test database: {'$' + TEST_DATABASE_URL_ENV if source else 'embedded'}"


#: how long a test marked ``alone`` may take, waiting for another one included
ALONE_TIMEOUT = 900


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the tiers are judged on every test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_promises(config, items)
    for item in items:
        if item.get_closest_marker("alone"):
            if file_of(item.nodeid) not in ALONE_FILES:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked alone: list its file in ALONE_FILES"
                    " (tests/support/alone_scheduling.py)"
                )
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(ALONE_TIMEOUT))


def check_promises(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each ``promise`` marker names a promise of the list (tests/support/promises.py); when the
    whole suite is collected, every promise has a test in the fast tier (not ``slow``, not
    ``alone``), or the run stops here, naming the promises without one."""
    fast: set[str] = set()
    for item in items:
        for mark in item.iter_markers("promise"):
            unknown = [p for p in mark.args if p not in PROMISES]
            if unknown or not mark.args:
                raise pytest.UsageError(
                    f"{item.nodeid}: promise marker names {unknown or 'nothing'}; the promises "
                    "are listed in tests/support/promises.py"
                )
            if not item.get_closest_marker("slow") and not item.get_closest_marker("alone"):
                fast.update(mark.args)
    tests = config.rootpath / "tests"
    whole = all(Path(str(a).split("::")[0]).resolve() == tests for a in config.args)
    missing = [p for p in PROMISES if p not in fast]
    if whole and missing:
        raise pytest.UsageError(
            f"promise(s) without a fast-tier test: {', '.join(missing)}; mark a test that "
            "fails when it breaks with @pytest.mark.promise(...) and keep it out of slow"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``: whole files, the files of the tests marked alone as one unit."""
    if config.getoption("dist") == "loadfile":
        return AloneTogether(config, log)
    return None


@pytest.fixture(autouse=True)
def _alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``alone`` waits until no other one runs, in any of the suite's processes.

    Each drives bridge processes with dozens of workers, and the broker's server, for
    minutes, and asserts that extensions kept up. In a run of the suite on two cores where they
    overlapped with each other and the rest, the broker's server answered extensions in 136 ms
    (1.4 s at p99) and 428 redeliveries of 1,132 held messages were counted where the bound is
    2%: a measure of the machine's load, not of the bridge. The lock file sits in the directory
    the suite's processes share.
    """
    if request.node.get_closest_marker("alone") is None:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with (shared / "alone.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL with the right to create databases."""
    url = os.environ.get(TEST_DATABASE_URL_ENV)
    if url:
        yield url
        return
    server = embedded.start(Path(tempfile.mkdtemp(prefix="fencebridge-test-pg-")))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    with migrated_template(pg_admin_url) as name:
        yield name


@pytest.fixture
def db_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with database_from(pg_admin_url, pg_template) as url:
        yield url


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test's database, for assertions."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def store(db_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore.connect(db_url, max_size=20)
    try:
        yield s
    finally:
        s.close()
