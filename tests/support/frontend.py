"""The protocol messages a client sends, counted from libpq's trace: how many round trips
(``Sync``, simple ``Query``) a store's call cost."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable

from psycopg import pq

from bridge.store import PostgresStore


def frontend_messages(store: PostgresStore, call: Callable[[], object]) -> Counter[str]:
    """The protocol messages the client sent during ``call``, by type (libpq's trace), on a
    store whose pool holds one connection."""
    with tempfile.TemporaryFile("w+") as trace:
        with store.pool.connection() as conn:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            call()
        finally:
            with store.pool.connection() as conn:
                conn.pgconn.untrace()
        trace.seek(0)
        lines = [line.split("\t") for line in trace.read().splitlines()]
    return Counter(parts[2].strip() for parts in lines if len(parts) > 2 and parts[0] == "F")
