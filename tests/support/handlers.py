"""Handlers for tests that run the bridge from its configuration file.

A configuration names a handler by import path and the bridge builds it with no arguments, so
everything a handler needs comes from the environment or from the payload it is given:

* :class:`RecordEffect` (class A) appends one row to ``test_effect`` in the bridge's own
  database, inside the fenced transaction: the effect commits with the settlement or not at all,
  so ``test_effect`` holds exactly one row per operation that succeeded, numbered in the order
  the handlers wrote them.
* :class:`SteadyProgress` (class B) works for a while, calling ``ctx.progress()`` as it goes,
  then writes its target record with the fence in the write's condition. The target is the
  database named by ``FENCEBRIDGE_TEST_TARGET_URL`` (else the bridge's own database). A payload
  may ask it to stall on one attempt (it stops reporting progress until its lease is gone) or
  to stay busy on one attempt (it reports progress until the lease is taken from it, as a
  stopping bridge does to the handlers it abandons).

Payloads are JSON objects; the keys below are read, anything else is ignored::

    {"sleep_seconds": 0.3}                      RecordEffect: pause before the write
    {"work_seconds": 4, "step_seconds": 0.2}    SteadyProgress: progress every step, for 4 s
    {"stall_on_attempt": 1}                     SteadyProgress: stop reporting on attempt 1
    {"busy_on_attempt": 1}                      SteadyProgress: on attempt 1, keep reporting
                                                progress until the lease is taken away

:func:`create_tables` makes both tables; tests call it before the bridge starts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from bridge.database import DATABASE_URL_ENV, Connection
from bridge.errors import LeaseLost
from bridge.handlers import ConditionalWriteHandler, Context, SameDatabaseHandler, Success
from bridge.targets.postgres import fenced_write

TARGET_URL_ENV = "FENCEBRIDGE_TEST_TARGET_URL"
#: how long a stalled or busy attempt lasts at most if nobody takes its lease away
STALL_LIMIT_SECONDS = 120.0

TABLES = """
CREATE TABLE IF NOT EXISTS test_effect (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text   NOT NULL,
    operation_id text   NOT NULL,
    fence        bigint NOT NULL,
    attempt      int    NOT NULL
);
CREATE TABLE IF NOT EXISTS test_target (
    tenant_id    text   NOT NULL,
    operation_id text   NOT NULL,
    last_fence   bigint NOT NULL,
    writes       int    NOT NULL,
    PRIMARY KEY (tenant_id, operation_id)
);
"""

EFFECT_INSERT = """
INSERT INTO test_effect (tenant_id, operation_id, fence, attempt)
VALUES (%(tenant_id)s, %(operation_id)s, %(fence)s, %(attempt)s)
"""

TARGET_WRITE = """
INSERT INTO test_target AS t (tenant_id, operation_id, last_fence, writes)
VALUES (%(tenant_id)s, %(operation_id)s, %(fence)s, 1)
ON CONFLICT (tenant_id, operation_id) DO UPDATE
   SET last_fence = EXCLUDED.last_fence, writes = t.writes + 1
 WHERE t.last_fence <= EXCLUDED.last_fence
RETURNING last_fence
"""


def create_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)


def instructions(ctx: Context) -> dict[str, Any]:
    """The payload's test instructions (an empty dict when it is not a JSON object)."""
    try:
        data = json.loads(ctx.payload)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class RecordEffect(SameDatabaseHandler):
    """Class A: one ``test_effect`` row, committed with the settlement under the fence."""

    def handle(self, ctx: Context, tx: Connection) -> Success:
        pause = float(instructions(ctx).get("sleep_seconds", 0))
        if pause:
            time.sleep(pause)
        tx.execute(
            EFFECT_INSERT,
            {
                "tenant_id": ctx.tenant_id,
                "operation_id": ctx.operation_id,
                "fence": ctx.fence,
                "attempt": ctx.attempt,
            },
        )
        return Success("recorded")


class SteadyProgress(ConditionalWriteHandler):
    """Class B: report progress for a while, then one fence-conditioned write of the target.

    ``release``, when given (in-process tests), keeps a stalled attempt from returning until the
    test has seen what it wanted to see; without it the attempt returns once its lease is gone.
    """

    def __init__(
        self, target_url: str | None = None, release: threading.Event | None = None
    ) -> None:
        self._url = target_url
        self._release = release
        #: (operation_id, attempt) in the order attempts started, for in-process tests
        self.started: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def _target_url(self) -> str:
        url = self._url or os.environ.get(TARGET_URL_ENV) or os.environ.get(DATABASE_URL_ENV)
        if not url:
            raise LookupError(f"set {TARGET_URL_ENV} or {DATABASE_URL_ENV}")
        return url

    def handle(self, ctx: Context) -> Success:
        with self._lock:
            self.started.append((ctx.operation_id, ctx.attempt))
        spec = instructions(ctx)
        step = float(spec.get("step_seconds", 0.1))
        busy = spec.get("busy_on_attempt") == ctx.attempt
        work = STALL_LIMIT_SECONDS if busy else float(spec.get("work_seconds", 0))
        end = time.monotonic() + work
        while time.monotonic() < end:
            ctx.progress()  # raises LeaseLost once the lease is gone
            time.sleep(step)
        if spec.get("stall_on_attempt") == ctx.attempt:
            self._stall(ctx)
        with psycopg.connect(self._target_url(), autocommit=True) as conn:
            fenced_write(
                conn,
                TARGET_WRITE,
                {"tenant_id": ctx.tenant_id, "operation_id": ctx.operation_id},
                ctx,
            )
        return Success("written")

    def _stall(self, ctx: Context) -> None:
        """Stop reporting progress until the lease is gone (and the test lets go), then stop."""
        ctx.lease_lost.wait(STALL_LIMIT_SECONDS)
        if self._release is not None:
            self._release.wait(STALL_LIMIT_SECONDS)
        ctx.progress()  # the lease is gone: this raises LeaseLost and the attempt ends
        raise LeaseLost(ctx.tenant_id, ctx.operation_id, ctx.fence, "stall")


#: the outbox destination :class:`RecordAndPublish` publishes to
ANNOUNCEMENTS = "announcements"


class RecordAndPublish(SameDatabaseHandler):
    """Class A: one ``test_effect`` row and one outbox message, in the fenced transaction.

    The message's attributes name its tenant and the job type ``announced``, so a fencebridge
    subscription on the destination can take it in (its operation id: the message id). With
    ``{"pause_on_attempt": N}`` attempt N says ``published fence=F`` on stdout once the
    message is written and then sleeps inside the transaction, for a test to pause the process
    there. Its transaction deadline is short so a paused run's transaction ends soon.
    """

    deadline = timedelta(seconds=3)

    def handle(self, ctx: Context, tx: Connection) -> Success:
        tx.execute(
            EFFECT_INSERT,
            {
                "tenant_id": ctx.tenant_id,
                "operation_id": ctx.operation_id,
                "fence": ctx.fence,
                "attempt": ctx.attempt,
            },
        )
        ctx.outbox.publish(
            ANNOUNCEMENTS,
            json.dumps({"operation": ctx.operation_id, "fence": ctx.fence}),
            attributes={"tenant_id": ctx.tenant_id, "job_type": "announced"},
        )
        if instructions(ctx).get("pause_on_attempt") == ctx.attempt:
            print(f"published fence={ctx.fence}", flush=True)
            time.sleep(STALL_LIMIT_SECONDS)
        return Success("recorded")
