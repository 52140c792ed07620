"""The store: every SQL statement of the bridge, by table family, on one database.

:class:`~bridge.store.db.Database` holds the pool and what every family's statements share (the
clock, kept connections, the identity keys held, the fenced write). The families each take
one: the outbox (:mod:`bridge.store.outbox`), the identity keys (:mod:`bridge.store.keys`), the
shadow record's report side (:mod:`bridge.store.shadow`), the console's queries
(:mod:`bridge.store.listing`) and the operators' (:mod:`bridge.store.operator`).
:class:`~bridge.store.postgres.PostgresStore` hands them out and holds the runtime's
statements (:class:`~bridge.store.work.WorkStore`); only the code that opens a store
(``fencebridge run``, the commands, tests) names it. Nothing outside this package holds the
pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.store.db import Clock, Database
from bridge.store.postgres import CONFLICT_REASON, PostgresStore
from bridge.store.work import (
    SWEEP_LIMIT_DEFAULT,
    FencedTransaction,
    KeyedStore,
    SettledClaim,
    Settlement,
    Swept,
    WorkStore,
)

__all__ = [
    "CONFLICT_REASON",
    "SWEEP_LIMIT_DEFAULT",
    "Clock",
    "Database",
    "FencedTransaction",
    "KeyedStore",
    "PostgresStore",
    "SettledClaim",
    "Settlement",
    "Swept",
    "WorkStore",
]

if TYPE_CHECKING:

    def _implements(store: PostgresStore) -> WorkStore:
        """Never called: mypy checks that the PostgreSQL store is the runtime's interface."""
        return store
