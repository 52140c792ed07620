"""A class A handler whose tenants can be held back by the test, for the backlog quota tests.

:class:`GatedEffect` writes :class:`~tests.support.handlers.RecordEffect`'s ``test_effect`` row,
except for a tenant listed in ``test_gate``: its rows are answered as rate limited (back to the
queue, no attempt used) for as long as the tenant is listed. The rows stay open, so the tenant's
backlog stays where it is, and no worker thread is held meanwhile: the other tenants' rows run.
"""

from __future__ import annotations

import psycopg

from bridge.database import Connection
from bridge.handlers import Context, RateLimited, SameDatabaseHandler, Success
from tests.support.handlers import EFFECT_INSERT, TABLES

GATE_TABLE = "CREATE TABLE IF NOT EXISTS test_gate (tenant_id text PRIMARY KEY)"
#: how long a held tenant's rows wait before they are tried again (seconds)
HELD_WAIT = 0.3


def create_gated_tables(url: str, *, closed_for: tuple[str, ...] = ()) -> None:
    """``test_effect`` and ``test_gate``, with ``closed_for``'s tenants held back."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)
        conn.execute(GATE_TABLE)
        for tenant in closed_for:
            conn.execute("INSERT INTO test_gate VALUES (%s) ON CONFLICT DO NOTHING", (tenant,))


def open_gate(url: str, tenant: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM test_gate WHERE tenant_id = %s", (tenant,))


class GatedEffect(SameDatabaseHandler):
    """Class A: one ``test_effect`` row, unless the tenant is held back (then rate limited)."""

    def handle(self, ctx: Context, tx: Connection) -> Success:
        held = tx.execute("SELECT 1 FROM test_gate WHERE tenant_id = %s", (ctx.tenant_id,))
        if held.fetchone() is not None:
            raise RateLimited("held_by_test", retry_after=HELD_WAIT)
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
