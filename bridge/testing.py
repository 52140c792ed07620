"""pytest fixtures for a team's own handler tests, shipped with the package.

A handler test runs the handler the way the bridge does: a work row in a real PostgreSQL (an
embedded server, or the one ``FENCEBRIDGE_TEST_DATABASE_URL`` names, on which the fixture may
create and drop databases), claimed under a fence and run by the executor of the handler's
target class, so a class A handler's write commits with its row, a class C handler is looked
up on a later attempt, a class D handler's intent is recorded before its call::

    def test_a_refund_is_applied_once(fencebridge):
        done = fencebridge.run(RefundHandler(), {"amount": 5}, tenant="acme", operation="r-1")
        assert done.state == "succeeded"

The fixtures are found by pytest's ``pytest11`` entry point (installing fencebridge is
enough); a database is made per test from a migrated template, and dropped afterwards.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from psycopg import conninfo
from psycopg import sql as pgsql

from bridge import keyring
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import Context, Handler, RetryPolicy
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.types import Delivery, Key

#: a server on which the fixtures may create and drop databases (else an embedded one)
TEST_DATABASE_URL_ENV: Final = "FENCEBRIDGE_TEST_DATABASE_URL"
#: the lease of a test's claims
LEASE: Final = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where a run left its work row."""

    state: str
    code: str | None
    detail: str | None
    attempts: int
    fence: int


class HandlerBench:
    """One test's database, and a handler run through its executor there."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store = PostgresStore.connect(url, max_size=4)
        self.hasher = IdentityHasher(secrets.token_hex(32).encode())
        keyring.attach(self.store.keys, self.hasher, used_by="fencebridge testing")

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        """An autocommit connection to the test's database (its tables, a class A handler's)."""
        return psycopg.connect(self.url, autocommit=True)

    def run(
        self,
        handler: Handler,
        payload: object = None,
        *,
        tenant: str = "tenant-1",
        operation: str = "operation-1",
        job_type: str = "job",
        max_attempts: int = 5,
    ) -> Outcome:
        """Deliver ``payload`` (JSON, or bytes as they are) once, claim it and run ``handler``
        on it as a worker does; the row's state afterwards."""
        registry = Registry()
        attempts = 1 if handler.target_class.value == "D" else max_attempts
        spec = registry.register(job_type, handler, retry=RetryPolicy(max_attempts=attempts))
        body = payload if isinstance(payload, bytes) else json.dumps(payload or {}).encode()
        key = Key(tenant, operation)
        self.store.inbox.ingest(
            [
                Delivery(
                    tenant_id=tenant,
                    operation_id=operation,
                    subscription="test",
                    job_type=job_type,
                    target_class=spec.target_class,
                    payload=body,
                    max_attempts=attempts,
                )
            ]
        )
        return self.again(handler, key, job_type=job_type, registry=registry)

    def again(
        self,
        handler: Handler,
        key: Key,
        *,
        job_type: str = "job",
        registry: Registry | None = None,
    ) -> Outcome:
        """Claim the operation once more (a retry, a takeover) and run ``handler`` on it."""
        if registry is None:
            registry = Registry()
            registry.register(job_type, handler)
        claims = self.store.claims.claim_keys("fencebridge-test", [key], LEASE)
        if claims:
            (claim,) = claims
            spec = registry[claim.job_type]
            execute(
                Run(
                    self.store.settle,
                    claim,
                    spec,
                    Context.for_claim(claim, self.hasher),
                    EventCounter(),
                )
            )
        return self.outcome(key)

    def outcome(self, key: Key) -> Outcome:
        row = self.store.operator.history(key).row
        if row is None:
            raise LookupError("no work row for this operation")
        return Outcome(
            state=row.state.value,
            code=row.outcome_code,
            detail=row.outcome_detail,
            attempts=row.attempts,
            fence=row.fence,
        )

    def close(self) -> None:
        self.store.close()


@pytest.fixture(scope="session")
def fencebridge_server() -> Iterator[str]:
    """A PostgreSQL server URL for the session: ``FENCEBRIDGE_TEST_DATABASE_URL``, or an
    embedded server started for it (``fencebridge[embedded]``)."""
    given = os.environ.get(TEST_DATABASE_URL_ENV)
    if given:
        yield given
        return
    from bridge import embedded  # noqa: PLC0415  (only without a server of one's own)

    server = embedded.start(Path(tempfile.mkdtemp(prefix="fencebridge-pytest-")))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fencebridge_template(fencebridge_server: str) -> Iterator[str]:
    """A database migrated once for the session, copied for each test."""
    name = f"fencebridge_template_{secrets.token_hex(4)}"
    _create(fencebridge_server, name)
    try:
        with psycopg.connect(_with_dbname(fencebridge_server, name), autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        _drop(fencebridge_server, name)


@pytest.fixture
def fencebridge(fencebridge_server: str, fencebridge_template: str) -> Iterator[HandlerBench]:
    """A fresh migrated database for one test, and a handler run as the bridge runs it."""
    name = f"fencebridge_test_{secrets.token_hex(6)}"
    _create(fencebridge_server, name, template=fencebridge_template)
    bench = HandlerBench(_with_dbname(fencebridge_server, name))
    try:
        yield bench
    finally:
        bench.close()
        _drop(fencebridge_server, name)


def _with_dbname(url: str, name: str) -> str:
    return conninfo.make_conninfo(url, dbname=name)


def _create(server: str, name: str, *, template: str | None = None) -> None:
    statement = pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name))
    if template is not None:
        statement = pgsql.SQL("{} TEMPLATE {}").format(statement, pgsql.Identifier(template))
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(statement)


def _drop(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )
