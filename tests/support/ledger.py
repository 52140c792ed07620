"""A target that keeps a ledger of its runs, for the multi-process tests of limits and rates.

Each run records its start (and end) in ``run_ledger`` by the database clock, sleeps a few
milliseconds as a call would, and writes its effect only under a fence not lower than the one
it holds (class B), on connections of its own: the tests read from the ledger how many runs
overlapped or started in a window, whatever the bridge itself reports.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from bridge.errors import FencedOut
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, RetryPolicy

Db = psycopg.Connection[Any]

#: the ledger of runs and the target's effects, one row per operation
LEDGER = """
CREATE TABLE run_ledger (
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    fence        bigint      NOT NULL,
    pid          integer     NOT NULL,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    PRIMARY KEY (tenant_id, operation_id, fence)
);
CREATE TABLE effect (
    tenant_id    text    NOT NULL,
    operation_id text    NOT NULL,
    fence        bigint  NOT NULL,
    PRIMARY KEY (tenant_id, operation_id)
)
"""


class LedgeredTarget(ConditionalWriteHandler):
    """Records each run in the ledger and writes the effect only under a fence not lower than
    the one it holds (class B), on connections of its own."""

    def __init__(self, url: str, work_seconds: float) -> None:
        self._url = url
        self._work_seconds = work_seconds
        self._local = threading.local()

    def _db(self) -> Db:
        if not hasattr(self._local, "db"):
            self._local.db = psycopg.connect(self._url, autocommit=True)
        conn: Db = self._local.db
        return conn

    def handle(self, ctx: Context) -> None:
        db = self._db()
        key = (ctx.tenant_id, ctx.operation_id, ctx.fence)
        db.execute(
            "INSERT INTO run_ledger (tenant_id, operation_id, fence, pid, started_at)"
            " VALUES (%s, %s, %s, %s, clock_timestamp())",
            (*key, os.getpid()),
        )
        time.sleep(self._work_seconds)
        applied = db.execute(
            "INSERT INTO effect AS e VALUES (%s, %s, %s)"
            " ON CONFLICT (tenant_id, operation_id) DO UPDATE SET fence = excluded.fence"
            " WHERE e.fence <= excluded.fence RETURNING 1",
            key,
        ).fetchone()
        db.execute(
            "UPDATE run_ledger SET ended_at = clock_timestamp()"
            " WHERE tenant_id = %s AND operation_id = %s AND fence = %s",
            key,
        )
        if applied is None:
            raise FencedOut(ctx.tenant_id, ctx.operation_id, ctx.fence, "effect write")


def ledgered_registry(url: str, job: str, lease: timedelta, work_seconds: float) -> Registry:
    """A registry running ``job`` on a :class:`LedgeredTarget`, with attempts to spare."""
    registry = Registry()
    registry.register(
        job, LedgeredTarget(url, work_seconds), retry=RetryPolicy(max_attempts=20), lease=lease
    )
    return registry


def count(db: Db, query: str, *params: object) -> int:
    found = db.execute(query, params).fetchone()
    assert found is not None
    return int(found[0])


def succeeded(db: Db) -> int:
    return count(db, "SELECT count(*) FROM work_item WHERE state = 'succeeded'")


def running(db: Db, pid: int | None = None) -> int | None:
    """The process of a run in progress whose claim still holds its row (of ``pid``, if given)."""
    found = db.execute(
        "SELECT l.pid FROM run_ledger l JOIN work_item w USING (tenant_id, operation_id, fence)"
        " WHERE l.ended_at IS NULL AND w.state = 'claimed' AND (%s::integer IS NULL OR l.pid = %s)"
        " LIMIT 1",
        (pid, pid),
    ).fetchone()
    return None if found is None else int(found[0])
