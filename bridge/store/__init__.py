"""The work store: two narrow interfaces over the same ``.sql`` files, and their PostgreSQL
implementation.

* :class:`~bridge.store.work.WorkStore` (:mod:`bridge.store.work`): what the runtime uses:
  ingest, claim, heartbeat, settle, sweep, watch, the counts. The inbox, the worker tier, the
  executors, the sweeper, held deliveries and the broker adapters depend on it, and on nothing
  else of the store.
* :class:`~bridge.store.operator.OperatorStore` (:mod:`bridge.store.operator`): what the
  operator commands use: histories, parked work, redrive, resolve, purge, erase.
* :class:`~bridge.store.postgres.PostgresStore` (:mod:`bridge.store.postgres`): both, on one
  connection pool; only the code that opens a store (``fencebridge run``, the commands, tests)
  names it.

Each interface is a :class:`typing.Protocol`: mypy keeps a runtime module away from an
operator query, and a fake for a test implements only the methods its code calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.store.db import Clock
from bridge.store.operator import OperatorStore
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
    "FencedTransaction",
    "KeyedStore",
    "OperatorStore",
    "PostgresStore",
    "SettledClaim",
    "Settlement",
    "Swept",
    "WorkStore",
]

if TYPE_CHECKING:

    def _implements(store: PostgresStore) -> tuple[WorkStore, OperatorStore]:
        """Never called: mypy checks that the PostgreSQL store is both interfaces."""
        return store, store
