"""Targets outside the database that fails over, for the failover tests.

The bridge's database is a primary and a standby that a test fails over; what a handler did to
the world must be recorded somewhere that does not fail over with it, or a lost commit would
take its evidence along. Both handlers write to ``FENCEBRIDGE_TEST_TARGET_URL`` (a database on
another server), each on a connection of its own, committed at once:

* :class:`LogFence` (class B) appends ``(operation, fence)`` to ``fo_attempt`` before its
  fenced write of ``fo_target``: two rows with one operation and one fence are two claims that
  were issued the same fence (the failure an epoch-less fence has after a failover).
* :class:`LogCall` (class D) appends ``(operation, fence)`` to ``fo_call`` for every call: two
  rows of one operation are two calls, which class D must never make.

:func:`create_target_tables` makes the tables.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

from bridge.handlers import ConditionalWriteHandler, Context, Success, UnfencedHandler
from bridge.targets.postgres import fenced_write
from tests.support.handlers import TARGET_URL_ENV, instructions

TABLES = """
CREATE TABLE IF NOT EXISTS fo_attempt (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL, fence bigint NOT NULL, pid int NOT NULL
);
CREATE TABLE IF NOT EXISTS fo_target (
    operation_id text PRIMARY KEY, last_fence bigint NOT NULL, writes int NOT NULL
);
CREATE TABLE IF NOT EXISTS fo_call (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL, fence bigint NOT NULL, pid int NOT NULL
);
"""
TARGET_WRITE = """
INSERT INTO fo_target AS t (operation_id, last_fence, writes)
VALUES (%(operation_id)s, %(fence)s, 1)
ON CONFLICT (operation_id) DO UPDATE
   SET last_fence = EXCLUDED.last_fence, writes = t.writes + 1
 WHERE t.last_fence <= EXCLUDED.last_fence
RETURNING last_fence
"""


def create_target_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)


class _Target:
    def __init__(self) -> None:
        self._url = os.environ[TARGET_URL_ENV]
        self._local = threading.local()

    def _db(self) -> psycopg.Connection[tuple[object, ...]]:
        conn: psycopg.Connection[tuple[object, ...]] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg.connect(self._url, autocommit=True)
        return conn

    def _log(self, table: str, ctx: Context) -> None:
        statement = (
            "INSERT INTO fo_attempt (operation_id, fence, pid) VALUES (%s, %s, %s)"
            if table == "fo_attempt"
            else "INSERT INTO fo_call (operation_id, fence, pid) VALUES (%s, %s, %s)"
        )
        self._db().execute(statement, (ctx.operation_id, ctx.fence, os.getpid()))


class LogFence(_Target, ConditionalWriteHandler):
    """Class B: log the claim's fence, take a moment, then the fenced write of the target."""

    def handle(self, ctx: Context) -> Success:
        self._log("fo_attempt", ctx)
        pause = float(instructions(ctx).get("work_seconds", 0))
        if pause:
            time.sleep(pause)
        fenced_write(self._db(), TARGET_WRITE, {"operation_id": ctx.operation_id}, ctx)
        return Success("written")


class LogCall(_Target, UnfencedHandler):
    """Class D: every call is one ``fo_call`` row."""

    def call(self, ctx: Context) -> Success:
        self._log("fo_call", ctx)
        pause = float(instructions(ctx).get("work_seconds", 0))
        if pause:
            time.sleep(pause)
        return Success("called")
