"""Shared fixtures: a PostgreSQL server for the run, a migrated template, a database per test.

The server is the one named by ``FENCEBRIDGE_TEST_DATABASE_URL`` (any database on it; tests
create and drop their own), or else an embedded server started for this run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bridge import embedded
from bridge.store import PostgresStore
from tests.support.postgres import (
    TEST_DATABASE_URL_ENV,
    database_from,
    migrated_template,
)


def pytest_report_header(config: pytest.Config) -> str:
    source = os.environ.get(TEST_DATABASE_URL_ENV)
    return f"fencebridge test database: {'$' + TEST_DATABASE_URL_ENV if source else 'embedded'}"


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
