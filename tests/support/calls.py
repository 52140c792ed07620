"""A class D handler for tests that run the bridge from its configuration file.

:class:`RecordCall` is a target with no fence, no key and no lookup: each call appends one row
to ``test_call`` in the bridge's own database (``FENCEBRIDGE_DATABASE_URL``), committed at once
on a connection of its own, outside anything the bridge writes. So ``test_call`` holds every
call that happened, whatever became of the work row: the evidence that a class D operation was
called at most once. The payload may ask its ``validate`` to take a while, which widens the
moment a claim holds its row before it records its intent, and its answer to take a while after
the call's row is in, which widens the moment between the effect and the settlement::

    {"validate_seconds": 0.03, "answer_seconds": 0.03}

:func:`create_calls_table` makes the table; tests call it before the bridge starts.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

from bridge.database import DATABASE_URL_ENV
from bridge.handlers import Context, Success, UnfencedHandler
from tests.support.handlers import instructions

CALLS_TABLE = """
CREATE TABLE IF NOT EXISTS test_call (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text   NOT NULL,
    operation_id text   NOT NULL,
    fence        bigint NOT NULL,
    attempt      int    NOT NULL
)
"""

CALL_INSERT = """
INSERT INTO test_call (tenant_id, operation_id, fence, attempt)
VALUES (%(tenant_id)s, %(operation_id)s, %(fence)s, %(attempt)s)
"""


def create_calls_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CALLS_TABLE)


class RecordCall(UnfencedHandler):
    """Class D: one ``test_call`` row per call, committed on the calling thread's connection."""

    def __init__(self) -> None:
        self._url = os.environ[DATABASE_URL_ENV]
        self._local = threading.local()

    def _db(self) -> psycopg.Connection[tuple[object, ...]]:
        conn: psycopg.Connection[tuple[object, ...]] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg.connect(self._url, autocommit=True)
        return conn

    def validate(self, ctx: Context) -> None:
        pause = float(instructions(ctx).get("validate_seconds", 0))
        if pause:
            time.sleep(pause)

    def call(self, ctx: Context) -> Success:
        self._db().execute(
            CALL_INSERT,
            {
                "tenant_id": ctx.tenant_id,
                "operation_id": ctx.operation_id,
                "fence": ctx.fence,
                "attempt": ctx.attempt,
            },
        )
        pause = float(instructions(ctx).get("answer_seconds", 0))
        if pause:
            time.sleep(pause)
        return Success("called")
