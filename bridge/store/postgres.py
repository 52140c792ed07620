"""The store on PostgreSQL: one :class:`~bridge.store.db.Database` and the table families on it.

:class:`PostgresStore` is the database (the pool, the clock, kept connections, the identity
keys held) and hands out one object per table family, each with its own audience:

* ``inbox`` (:class:`~bridge.store.ingest.IngestStore`): received batches, the inbox's;
* ``claims`` (:class:`~bridge.store.claims.ClaimStore`): the claims, under the
  :class:`~bridge.store.claims.ClaimPolicy` given here, for the process's life;
* ``settle`` (:class:`~bridge.store.settle.SettleStore`): every write made for a claim under
  its fence, and the sweep;
* ``operator`` (:class:`~bridge.store.operator.OperatorQueries`), ``console``
  (:class:`~bridge.store.listing.ConsoleQueries`), ``shadow``
  (:class:`~bridge.store.shadow.ShadowStore`): what people read and move;
* ``outbox`` (:class:`~bridge.store.outbox.OutboxStore`) and ``keys``
  (:class:`~bridge.store.keys.KeyStore`).

Every statement lives in ``bridge/sql/store/<name>.sql``. ``now`` is the database clock unless
the store was given a clock (tests do, to expire leases without sleeping).
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import ConnectionPool

from bridge.database import Connection, SessionTimeouts, open_pool
from bridge.store.claims import ClaimPolicy, ClaimStore
from bridge.store.db import Clock, Database, database_clock
from bridge.store.ingest import IngestStore
from bridge.store.keys import KeyStore
from bridge.store.listing import ConsoleQueries
from bridge.store.operator import OperatorQueries
from bridge.store.outbox import OutboxStore
from bridge.store.settle import SettleStore
from bridge.store.shadow import ShadowStore
from bridge.store.work import ATTEMPT_HISTORY_DEFAULT, PRIORITY_AGING_DEFAULT


class PostgresStore(Database):
    """The database and its table families. Thread-safe: every call borrows a pooled
    connection (or the one its thread keeps)."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        clock: Clock = database_clock,
        attempt_history: int = ATTEMPT_HISTORY_DEFAULT,
        priority_aging: timedelta = PRIORITY_AGING_DEFAULT,
        policy: ClaimPolicy | None = None,
    ) -> None:
        super().__init__(
            pool, clock=clock, attempt_history=attempt_history, priority_aging=priority_aging
        )
        policy = policy if policy is not None else ClaimPolicy()
        self.settle = SettleStore(self)
        self.claims = ClaimStore(self, policy, self.settle)
        self.inbox = IngestStore(self, policy)
        self.operator = OperatorQueries(self, policy)
        self.console = ConsoleQueries(self)
        self.shadow = ShadowStore(self)
        self.outbox = OutboxStore(self)
        self.keys = KeyStore(self)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        clock: Clock = database_clock,
        timeouts: SessionTimeouts | None = None,
        attempt_history: int = ATTEMPT_HISTORY_DEFAULT,
        priority_aging: timedelta = PRIORITY_AGING_DEFAULT,
        generic_plans: bool = False,
        policy: ClaimPolicy | None = None,
    ) -> PostgresStore:
        """A store on a new pool; every connection is bounded by ``timeouts`` (the defaults of
        :class:`~bridge.database.SessionTimeouts` unless given). ``generic_plans``: see
        :func:`~bridge.database.open_pool` (the bridge's own store sets it)."""
        pool = open_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeouts=timeouts,
            generic_plans=generic_plans,
        )
        return cls(
            pool,
            clock=clock,
            attempt_history=attempt_history,
            priority_aging=priority_aging,
            policy=policy,
        )
