"""What a store's connection has read, from PostgreSQL's cumulative statistics."""

from __future__ import annotations

import psycopg

from bridge.store import PostgresStore


def flushed(
    store: PostgresStore, db: psycopg.Connection[tuple[object, ...]], query: str
) -> tuple[object, ...]:
    """``query``'s row of the cumulative statistics, once the store's one connection has sent
    what it counted (PostgreSQL 15 sends at the end of the next transaction when forced, else at
    most once a second), read afresh."""
    with store.pool.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    found = db.execute(query).fetchone()
    assert found is not None
    return found
