"""The store: every SQL statement of the bridge, by table family, on one database.

:class:`~bridge.store.db.Database` holds the pool and what every family's statements share (the
clock, kept connections, the identity keys held, the fenced write). The families each take
one: the inbox's writes (:mod:`bridge.store.ingest`), the claims under their policy
(:mod:`bridge.store.claims`), the fenced writes and the sweep (:mod:`bridge.store.settle`), the
operators' queries (:mod:`bridge.store.operator`), the console's (:mod:`bridge.store.listing`),
the shadow record's report side (:mod:`bridge.store.shadow`), the outbox
(:mod:`bridge.store.outbox`) and the identity keys (:mod:`bridge.store.keys`).
:class:`~bridge.store.postgres.PostgresStore` is the database and hands them out; only the code
that opens a store (``fencebridge run``, the commands, tests) names it. A family's user that
needs a second implementation (a test's fake, a shadow subscription's record) declares the role
it uses beside itself, as :class:`bridge.ingest.inbox.InboxStore` does. Nothing outside this
package holds the pool.
"""

from __future__ import annotations

from bridge.store.db import Clock, Database
from bridge.store.ingest import CONFLICT_REASON
from bridge.store.postgres import PostgresStore
from bridge.store.work import (
    SWEEP_LIMIT_DEFAULT,
    FencedTransaction,
    SettledClaim,
    Settlement,
    Swept,
)

__all__ = [
    "CONFLICT_REASON",
    "SWEEP_LIMIT_DEFAULT",
    "Clock",
    "Database",
    "FencedTransaction",
    "PostgresStore",
    "SettledClaim",
    "Settlement",
    "Swept",
]
