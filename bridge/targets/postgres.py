"""Class B on a PostgreSQL table that stores the last fence that wrote each record.

The statement is yours (in your own ``.sql`` file): an ``UPDATE`` or an upsert whose condition
includes ``last_fence <= %(fence)s`` and which sets ``last_fence = %(fence)s`` and ends in
``RETURNING``. For example::

    INSERT INTO account_balance (tenant_id, account_id, balance, last_fence)
    VALUES (%(tenant_id)s, %(account_id)s, %(balance)s, %(fence)s)
    ON CONFLICT (tenant_id, account_id) DO UPDATE
       SET balance = EXCLUDED.balance, last_fence = EXCLUDED.last_fence
     WHERE account_balance.last_fence <= EXCLUDED.last_fence
    RETURNING last_fence

``<=`` rather than ``<`` lets the same claim repeat its own write. No row back means the record
carries a higher fence: a newer claim has written, and this write is fenced out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, LiteralString

import psycopg

from bridge.errors import FencedOut
from bridge.handlers import Context


def fenced_write(
    conn: psycopg.Connection[Any],
    statement: LiteralString,
    params: Mapping[str, Any],
    ctx: Context,
) -> tuple[Any, ...]:
    """Execute a fence-conditioned statement; raise FencedOut when the target refuses it."""
    if "%(fence)s" not in statement or "RETURNING" not in statement.upper():
        raise ValueError(
            "a fenced write must compare %(fence)s in its condition and end in RETURNING"
        )
    row = conn.execute(statement, {**params, "fence": ctx.fence}).fetchone()
    if row is None:
        raise FencedOut(ctx.tenant_id, ctx.operation_id, ctx.fence, "target write")
    return tuple(row)
