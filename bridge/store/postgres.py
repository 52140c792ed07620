"""The work store on PostgreSQL: one class, both the runtime's
:class:`~bridge.store.work.WorkStore` and the operators'
:class:`~bridge.store.operator.OperatorStore`.

Term-scoped writes
------------------
A claim is one statement: it locks claimable rows with ``FOR UPDATE SKIP LOCKED``, adds one to
each row's ``fence`` and ``attempts``, and sets the lease from the database clock. From then on,
every write made for that claim (heartbeat, settlement, intent, a class A business transaction)
carries the fence in its own ``WHERE`` clause::

    UPDATE work_item SET ... WHERE <key> AND fence = :fence AND state = 'claimed'

The database decides, inside the write, whether the writer still owns the row. Zero rows means
ownership moved on (a newer claim, the sweeper, a settlement): the store raises
:class:`~bridge.errors.LeaseLost` and the caller must stop and never retry that write. Nothing
here reads the row, compares in Python and then writes; a review that finds such a sequence on
ownership has found a bug.

::

    queued ──claim──▶ claimed ──settle──▶ succeeded | failed_terminal | unknown | quarantined
      ▲                 │  │
      └──retry_later────┘  └─lease expired, attempts left──▶ claimed again (takeover, fence + 1)
                           └─lease expired, attempts exhausted──sweep──▶ unknown
    unknown | quarantined ──redrive (audited)──▶ queued

The lease is liveness only; the fence is safety. A lease can be any length without putting
safety at risk, which is what lets heartbeats follow progress instead of time.

Every statement lives in ``bridge/sql/store/<name>.sql``. ``now`` is the database clock unless
the store was given a clock (tests do, to expire leases without sleeping).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
import psycopg.sql
from psycopg import RawCursor, pq
from psycopg.abc import Query
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from bridge import sql
from bridge.database import Connection, SessionTimeouts, milliseconds, open_pool, translate_errors
from bridge.deadline import TransactionDeadline
from bridge.errors import (
    ConfigError,
    DeadlineExceeded,
    ErasureRefused,
    IdentityKeysOutdated,
    LeaseLost,
    StoreError,
    StoreUnavailable,
)
from bridge.store.evidence import record_replays
from bridge.store.listing import (
    FigurePoint,
    GroupCount,
    PayloadView,
    RejectedSummary,
    RowSummary,
)
from bridge.store.operator import SHADOW_PAGE_DEFAULT
from bridge.store.records import (
    AttemptRecord,
    ErasureCounts,
    ErasureRecord,
    LiftedWait,
    OperationHistory,
    ParkedRow,
    PurgeCounts,
    QuarantinedDelivery,
    RateWait,
    RedriveRecord,
    RejectedRecord,
    RejectedStatus,
    ResolvedDelivery,
    SeenOperation,
    WorkRecord,
)
from bridge.store.work import (
    ATTEMPT_HISTORY_DEFAULT,
    PRIORITY_AGING_DEFAULT,
    SWEEP_LIMIT_DEFAULT,
    TOMBSTONE_DAYS_DEFAULT,
    UNSTARTED_CLAIMS_MAX,
    ConcurrencyLimit,
    QuotaDeferred,
    SettledClaim,
    Settlement,
    Swept,
    TokenRate,
    WaitingCount,
)
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    RedriveFilter,
    Redriven,
    Rejection,
    State,
    StateCount,
    Stats,
    TargetClass,
    Ticket,
)

Clock = Callable[[], datetime | None]

#: how long a thread keeps one connection (:meth:`PostgresStore.keep_connection`) before it
#: hands it back and takes another: the pool renews connections only as they come back
KEEP_SECONDS = 60.0

#: the SQLSTATE of a refused one-round-trip write (migrations 0022, 0023): the batch was not all
#: new
NOT_NEW = "FBNEW"
#: the SQLSTATE of an inbox write refused because an erasure hashed its tombstones under none of
#: the keys this process holds, and of an erasure by a process without the current key (0024)
KEYS_MISSED = "FBKEY"
#: an erasure refused, nothing erased: rows or messages in scope not settled (object_in_use),
#: rows written after their hashes were computed (serialization_failure), the current key not
#: held
ERASURE_REFUSALS = frozenset({"55006", "40001", KEYS_MISSED})
CONFLICT_REASON = "payload hash differs from the operation's approved payload"
#: a conflict with a tombstone: recorded without the raw identifiers the erasure removed
ERASED_CONFLICT_REASON = "payload hash differs from the erased operation's payload"

#: an operation's tombstone hash under every identity key held, by key id (:mod:`bridge.identity`)
ErasedHashes = Callable[[str, str], list[tuple[int, bytes]]]


def _database_clock() -> datetime | None:
    return None


class PostgresFencedTransaction:
    """An open transaction in which the work row is locked under its fence (target class A).

    The handler writes its business rows through :attr:`connection`; :meth:`settle` marks the
    work row in the same transaction. Both commit together when the ``with`` block ends, or
    neither does.
    """

    def __init__(
        self,
        connection: Connection,
        ticket: Ticket,
        now: datetime | None,
        deadline: TransactionDeadline | None = None,
        *,
        history: int = ATTEMPT_HISTORY_DEFAULT,
    ) -> None:
        self.connection = connection
        self.ticket = ticket
        self._now = now
        self._history = history
        #: past it the transaction is cancelled and rolled back (None: no deadline)
        self.deadline = deadline
        self.settled: State | None = None

    def settle(
        self, state: State = State.SUCCEEDED, outcome_code: str = "ok", detail: str | None = None
    ) -> None:
        row = self.connection.execute(
            sql.statement("settle"),
            {
                **_ticket_params(self.ticket),
                "state": state.value,
                "outcome_code": outcome_code,
                "outcome_detail": detail,
                "error_class": None,
                "finding": None,
                "now": self._now,
                "history": self._history,
            },
        ).fetchone()
        if row is None:  # cannot happen while we hold the row lock; kept as a guard
            raise _lost(self.ticket, "settle")
        self.settled = state


class PostgresStore:
    """The work store on PostgreSQL. Thread-safe: every call borrows a pooled connection."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        clock: Clock = _database_clock,
        attempt_history: int = ATTEMPT_HISTORY_DEFAULT,
        priority_aging: timedelta = PRIORITY_AGING_DEFAULT,
    ) -> None:
        if attempt_history < 0:
            raise ValueError("attempt_history is a count of attempts kept per row (0: none)")
        if priority_aging < timedelta(0):
            raise ValueError("priority_aging is how far one priority step moves a row: not < 0")
        self._pool = pool
        self._now = clock
        #: attempts kept per row, written by the statements that end attempts (0 records none)
        self._history = attempt_history
        #: seconds of claim order one priority step is worth (migration 0012)
        self._aging = priority_aging.total_seconds()
        #: set by :func:`bridge.keyring.attach`: the id new rows carry, the ids claims accept
        self._identity_key: int | None = None
        self._identity_keys: list[int] | None = None
        #: set with the keys: how the inbox finds an inserted operation's tombstone
        self._erased_hashes: ErasedHashes | None = None
        #: set by :meth:`use_concurrency_limits`: the limited job types, read by the claims
        self._concurrency: dict[str, ConcurrencyLimit] = {}
        #: set by :meth:`use_token_rates`: the rate-limited job types, read by the claims
        self._rates: dict[str, TokenRate] = {}
        #: set by :meth:`use_tenant_fairness`: claims take tenants in turn (claim_fair.sql)
        self._fair: _FairWalk | None = None
        #: the connection each thread that called :meth:`keep_connection` uses
        self._kept = threading.local()
        self._kept_lock = threading.Lock()
        self._kept_open: set[Connection] = set()

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        clock: Clock = _database_clock,
        timeouts: SessionTimeouts | None = None,
        attempt_history: int = ATTEMPT_HISTORY_DEFAULT,
        priority_aging: timedelta = PRIORITY_AGING_DEFAULT,
        generic_plans: bool = False,
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
            pool, clock=clock, attempt_history=attempt_history, priority_aging=priority_aging
        )

    @property
    def pool(self) -> ConnectionPool[Connection]:
        return self._pool

    def close(self) -> None:
        """Close the pool, and the connections threads still keep (the pool closes those only
        once they come back)."""
        with self._kept_lock:
            kept, self._kept_open = self._kept_open, set()
        for conn in kept:
            conn.close()
        self._pool.close()

    def use_identity_keys(
        self, current: int, held: Sequence[int], erased: ErasedHashes | None = None
    ) -> None:
        """Write new rows under identity key ``current``; claim only rows written under a key
        in ``held`` (a row under another key needs a process that holds it); ``erased`` derives
        the tombstone hashes the inbox looks erased operations up by. Until called, new rows
        take the database's current key, claims take any row, and an ingest that would write
        new work refuses while any tombstone exists (it cannot tell whether one matches)."""
        self._identity_key = current
        self._identity_keys = list(held)
        self._erased_hashes = erased

    def use_concurrency_limits(self, limits: Mapping[str, ConcurrencyLimit]) -> None:
        """Claim rows of these job types only within their concurrency limits. Every process
        claiming a job type must carry the same limits: the database enforces them among the
        claims that pass them, and a claim that passes none takes no slot into account."""
        self._concurrency = {job: limit for job, limit in limits.items() if limit.limited}

    def use_tenant_fairness(self, weights: Mapping[str, int] | None = None) -> None:
        """Claim tenants in turn, each taking its share of a claim by its weight (1 unless
        given). Concurrency-limited claims keep the order rows became due."""
        self._fair = _FairWalk(dict(weights or {}))

    def concurrency_limited(self, job_type: str) -> bool:
        """Whether claims of ``job_type`` wait for a slot under a concurrency limit."""
        return job_type in self._concurrency

    def use_token_rates(self, rates: Mapping[str, TokenRate]) -> None:
        """Claim rows of these job types only within their token rates: every run a claim
        starts (a takeover too) spends a token of its job type's bucket and of its (job type,
        tenant)'s, kept in the database (migration 0018). Every process claiming a job type
        must carry the same rates, as for the concurrency limits."""
        self._rates = {job: rate for job, rate in rates.items() if rate.limited}

    def _claim_statement(self, limits: _Limits | None, limit: int) -> tuple[str, dict[str, Any]]:
        """The claim statement for these limits and its extra parameters."""
        if limits is not None:
            return sql.with_limit("claim_limited", limit), {}
        if self._fair is not None:
            return sql.with_limit("claim_fair", limit), self._fair.params()
        return sql.with_limit("claim", limit), {}

    def _limits(self, job_types: Sequence[str] | None) -> _Limits | None:
        """The ``%(slots)s`` and ``%(rates)s`` of a claim: the concurrency limits and the token
        rates of the job types it may claim, or None (claim.sql, no limit check) when none of
        them is limited."""
        concurrency = self._concurrency if job_types is None else job_types
        slots = {
            job: [self._concurrency[job].total, self._concurrency[job].per_tenant]
            for job in concurrency
            if job in self._concurrency
        }
        rated = self._rates if job_types is None else job_types
        rates = {job: self._rates[job].buckets() for job in rated if job in self._rates}
        if not slots and not rates:
            return None
        return _Limits(Jsonb(slots) if slots else None, Jsonb(rates) if rates else None)

    def keep_connection(self) -> None:
        """From now on this thread's calls use one connection (until :meth:`release_connection`
        or a call that fails), not the pool's oldest idle one each time: a loop that calls many
        times a second keeps its server process, and that process's caches, warm (measured:
        docs/benchmarks.md, "Worker tier"). The connection goes back to the pool every
        :data:`KEEP_SECONDS`, so the pool's own age limit still renews it."""
        self._kept.on = True

    def release_connection(self) -> None:
        """Give the connection this thread kept back to the pool (nothing if it kept none)."""
        self._kept.on = False
        self._return_kept()

    def _return_kept(self) -> None:
        conn: Connection | None = getattr(self._kept, "conn", None)
        self._kept.conn = None
        if conn is not None:
            with self._kept_lock:
                self._kept_open.discard(conn)
            self._pool.putconn(conn)  # a broken one is discarded, an open transaction rolled back

    @contextmanager
    def _connection(self, action: str) -> Iterator[Connection]:
        if not getattr(self._kept, "on", False):
            with translate_errors(action), self._pool.connection() as conn:
                yield conn
            return
        kept: Connection | None = getattr(self._kept, "conn", None)
        if kept is not None and time.monotonic() >= self._kept.until:
            self._return_kept()
            kept = None
        try:
            with translate_errors(action):
                if kept is None:
                    kept = self._kept.conn = self._pool.getconn()
                    self._kept.until = time.monotonic() + KEEP_SECONDS
                    with self._kept_lock:
                        self._kept_open.add(kept)
                yield kept
        except BaseException:
            self._return_kept()  # the next call takes a connection known to be good
            raise

    def _fenced_write(
        self, action: str, name: str, ticket: Ticket, /, **params: Any
    ) -> tuple[Any, ...]:
        """Run one statement guarded by ``fence = :fence AND state = 'claimed'``.

        The row it returns is the proof the fence was current; no row raises LeaseLost.
        """
        with self._connection(action) as conn:
            row = conn.execute(
                sql.statement(name),
                {
                    **_ticket_params(ticket),
                    **params,
                    "now": self._now(),
                    "history": self._history,
                    "aging": self._aging,
                },
            ).fetchone()
        if row is None:
            raise _lost(ticket, action)
        return row

    def _guarded_write(self, name: str, params: dict[str, Any], *, dry_run: bool) -> bool:
        """Run one operator move whose guard is inside the statement; False when the row had
        moved on. A dry run executes it and rolls back."""
        with self._connection("redrive") as conn, conn.transaction(force_rollback=dry_run):
            row = conn.execute(
                sql.statement(name), {**params, "now": self._now(), "aging": self._aging}
            ).fetchone()
        return row is not None

    # -- inbox -------------------------------------------------------------------------------

    def ingest(
        self, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None = None
    ) -> list[IngestResult]:
        """Write one received batch in one transaction; one result per delivery, in order.

        New keys become queued work rows; a key that exists with the same payload hash is a
        replay; with another hash it is a conflict (nothing is mutated, the delivery is recorded
        as rejected). Rejections (undecodable input) are recorded with their reason. After this
        returns, every delivery of the batch is held by the database and may be acknowledged.
        With ``claim``, up to its limit of the new rows the hand-off claim would take are
        written claimed for its worker instead, and come back with their :class:`Claim`.
        """
        firsts = _firsts(batch)
        with self._connection("ingest") as conn:
            if len(firsts) == len(batch) > 0:
                claims = self._ingest_new(conn, firsts, claim)
                if claims is not None:
                    return [_new(key, claims.get(key)) for key in firsts]
            with conn.transaction():
                return self._ingest(conn, batch, claim)

    def _ingest_new(
        self, conn: Connection, firsts: dict[Key, Delivery], claim: InsertClaim | None
    ) -> dict[Key, Claim] | None:
        """Write a batch of deliveries of distinct keys as new operations in one statement
        (ingest_insert_new.sql: the insert and its check that every key was new and none has
        a tombstone), its own transaction; the rows written claimed, by key. None when the
        check refused: the statement failed, nothing of it committed, and the batch goes the
        careful way, in a transaction of its own.

        Most batches are new work, and the careful way costs three round trips (BEGIN, the
        insert with its tombstone lookup, COMMIT), each a wake-up of this thread and of the
        server's process. One statement is one round trip, and costs the client less than the
        insert and a separate check sent in one pipeline did (measured: docs/benchmarks.md,
        "Inbox to settle, end to end"). No BEGIN and no ROLLBACK: psycopg forgets every
        prepared statement of a connection at a ROLLBACK, and a refusal would cost the next
        statements their plans.
        """
        params = {
            **self._insert_params(list(firsts.values()), claim),
            **self._tombstone_hashes(list(firsts)),
            "expected": len(firsts),
        }
        try:
            rows = conn.execute(sql.statement("ingest_insert_new"), params).fetchall()
        except psycopg.DatabaseError as exc:
            if exc.sqlstate == NOT_NEW:
                return None
            _refuse_if_keys_missed(exc)
            raise
        return _written_claimed(firsts, rows)

    def _tombstone_hashes(self, keys: Sequence[Key]) -> dict[str, Any]:
        """ingest_insert_new.sql's tombstone lookup: the keyed hashes of ``keys`` under every
        identity key held, or, with none to hash by, a lookup of any tombstone at all."""
        hashed = self._hashed(keys)
        return {
            "key_id": [key_id for _, key_id, _ in hashed],
            "operation_hash": [digest for _, _, digest in hashed],
            "any_erased": self._erased_hashes is None,
        }

    def _hashed(self, keys: Sequence[Key]) -> list[tuple[Key, int, bytes]]:
        """Each key with its keyed hash under every identity key held (none without them)."""
        derive = self._erased_hashes
        if derive is None:
            return []
        return [
            (key, key_id, digest)
            for key in keys
            for key_id, digest in derive(key.tenant_id, key.operation_id)
        ]

    def _insert_params(
        self, fresh: Sequence[Delivery], claim: InsertClaim | None
    ) -> dict[str, Any]:
        """ingest_insert.sql's (and ingest_insert_new.sql's) parameters for new operations, each
        with a payload reference drawn for this write and, for ``claim``, its lease where it
        may be written claimed."""
        # One random draw per batch, not per delivery (each is a system call): the batch's
        # token and the delivery's place in it are unique together.
        batch = secrets.token_hex(16)
        refs = [f"pg:{batch}-{i}" for i in range(len(fresh))]
        return {
            **insert_params(fresh, refs, self._insert_leases(fresh, claim)),
            "worker": claim.worker if claim is not None else None,
            "identity_key_id": self._identity_key,
            "aging": self._aging,
            "now": self._now(),
        }

    def _insert_leases(
        self, fresh: Sequence[Delivery], claim: InsertClaim | None
    ) -> list[float | None] | None:
        """Each new row's lease in seconds where it may be written claimed for ``claim`` (None:
        queued), up to its limit, in delivery order: only a row the hand-off claim would take,
        which a concurrency limit, a token rate (both counted by the claim statements), an
        ordered group (only its earliest open row may run) or an identity key this process does
        not hold would keep from it. A rate limit's wait is the statement's to check."""
        if claim is None or claim.limit < 1:
            return None
        held = self._identity_keys
        if held is not None and self._identity_key not in held:
            return None
        left = claim.limit
        leases: list[float | None] = []
        for d in fresh:
            lease = claim.leases.get(d.job_type)
            if (
                left
                and lease is not None
                and d.ordering_key is None
                and d.job_type not in self._concurrency
                and d.job_type not in self._rates
            ):
                leases.append(lease.total_seconds())
                left -= 1
            else:
                leases.append(None)
        return leases if left < claim.limit else None

    def _ingest(
        self, conn: Connection, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None
    ) -> list[IngestResult]:
        """:meth:`ingest`'s statements, inside the caller's transaction."""
        firsts = _firsts(batch)
        inserted: set[Key] = set()
        claims: dict[Key, Claim] = {}
        erased: dict[Key, _Tombstone] = {}
        if firsts:
            inserted, claims, erased = self._insert(conn, firsts, claim)
        if not erased and len(inserted) == len(firsts) == len(batch):
            # Every delivery a new operation (the common batch): nothing else to decide.
            return [_new(key, claims.get(key)) for key in firsts]
        inserted -= erased.keys()
        stored = _existing(conn, [k for k in firsts if k not in inserted and k not in erased])
        for key in inserted:
            stored[key] = (
                firsts[key].payload_hash,
                State.CLAIMED if key in claims else State.QUEUED,
            )

        results: list[IngestResult] = []
        rejected: list[Rejection | Delivery | _ErasedConflict] = []
        replays: list[Key] = []
        for item in batch:
            if isinstance(item, Rejection):
                results.append(IngestResult(Decision.QUARANTINED, _rejection_key(item)))
                rejected.append(item)
                continue
            tombstone = erased.get(item.key)
            if tombstone is not None:
                same = item.payload_hash == tombstone.payload_hash
                decision = Decision.REPLAY if same else Decision.CONFLICT
                results.append(IngestResult(decision, item.key, tombstone.state, erased=True))
                if not same:
                    rejected.append(_ErasedConflict(item, tombstone))
                continue
            stored_hash, state = stored[item.key]
            if item is firsts[item.key] and item.key in inserted:
                results.append(_new(item.key, claims.get(item.key)))
            elif item.payload_hash == stored_hash:
                results.append(IngestResult(Decision.REPLAY, item.key, state))
                replays.append(item.key)
            else:
                results.append(IngestResult(Decision.CONFLICT, item.key, state))
                rejected.append(item)
        if rejected:
            conn.execute(sql.statement("reject"), _reject_params(rejected))
        record_replays(conn, replays, self._now())
        return results

    def _insert(
        self, conn: Connection, firsts: dict[Key, Delivery], claim: InsertClaim | None
    ) -> tuple[set[Key], dict[Key, Claim], dict[Key, _Tombstone]]:
        """Insert a batch's new operations: the keys inserted, the rows of them written claimed
        (none that matches a tombstone), and those that match a tombstone (taken back out
        again)."""
        lookup = self._erased_lookup(list(firsts))
        # One round trip: the tombstone lookup is sent with the insert and runs after it,
        # on a snapshot of its own (see ingest_erased.sql for why it must come after).
        try:
            with conn.pipeline():
                rows_cursor = conn.execute(
                    sql.statement("ingest_insert"),
                    self._insert_params(list(firsts.values()), claim),
                )
                hits_cursor = conn.execute(*lookup)
                rows = rows_cursor.fetchall()
                hits = hits_cursor.fetchall()
        except psycopg.DatabaseError as exc:
            _refuse_if_keys_missed(exc)
            raise
        inserted = {Key(t, o) for t, o, _, _ in rows}
        erased = self._erased(conn, inserted, hits)
        claims = _written_claimed(firsts, rows)
        for key in erased:
            claims.pop(key, None)
        return inserted, claims, erased

    def ingest_shadow(self, batch: Sequence[Delivery | Rejection]) -> list[IngestResult]:
        """Record one batch of a shadow subscription in one transaction, deciding each delivery
        as :meth:`ingest` does (new, replay, conflict, quarantined), in shadow_operation and
        shadow_delivery: no work row, no payload, nothing any claim reads. One result per
        delivery, in order; after this returns the batch may be acknowledged."""
        if not batch:
            return []
        subscription = batch[0].subscription
        if any(item.subscription != subscription for item in batch):
            raise ValueError("a shadow batch comes from one subscription")
        firsts = _firsts(batch)
        now = self._now()
        with self._connection("shadow ingest") as conn, conn.transaction():
            inserted: set[Key] = set()
            if firsts:
                rows = conn.execute(
                    sql.statement("shadow_insert"),
                    {
                        "subscription": [d.subscription for d in firsts.values()],
                        "tenant_id": [d.tenant_id for d in firsts.values()],
                        "operation_id": [d.operation_id for d in firsts.values()],
                        "job_type": [d.job_type for d in firsts.values()],
                        "payload_hash": [d.payload_hash for d in firsts.values()],
                        "now": now,
                    },
                ).fetchall()
                inserted = {Key(t, o) for t, o in rows}
            stored = {k: d.payload_hash for k, d in firsts.items() if k in inserted}
            others = [k for k in firsts if k not in inserted]
            if others:
                rows = conn.execute(
                    sql.statement("shadow_existing"),
                    {**_keys_params(others), "subscription": subscription},
                ).fetchall()
                stored.update({Key(t, o): bytes(h) for t, o, h in rows})
            if len(stored) < len(firsts):
                raise StoreUnavailable(
                    "shadow ingest: an operation vanished mid-batch (erased); retry"
                )
            results: list[IngestResult] = []
            for item in batch:
                if isinstance(item, Rejection):
                    results.append(IngestResult(Decision.QUARANTINED, _rejection_key(item)))
                elif item is firsts[item.key] and item.key in inserted:
                    results.append(IngestResult(Decision.NEW, item.key))
                elif item.payload_hash == stored[item.key]:
                    results.append(IngestResult(Decision.REPLAY, item.key))
                else:
                    results.append(IngestResult(Decision.CONFLICT, item.key))
            conn.execute(sql.statement("shadow_record"), _shadow_params(batch, results, now))
        return results

    def _erased_lookup(self, keys: Sequence[Key]) -> tuple[LiteralString, dict[str, Any]]:
        """The statement that finds these keys' tombstones: by their keyed hashes under every
        identity key held; with no keys bound, whether any tombstone exists at all."""
        if self._erased_hashes is None:
            return sql.statement("erased_any"), {}
        hashed = self._hashed(keys)
        return sql.statement("ingest_erased"), {
            "tenant_id": [key.tenant_id for key, _, _ in hashed],
            "operation_id": [key.operation_id for key, _, _ in hashed],
            "key_id": [key_id for _, key_id, _ in hashed],
            "operation_hash": [digest for _, _, digest in hashed],
        }

    def _erased(
        self, conn: Connection, inserted: set[Key], hits: Sequence[tuple[Any, ...]]
    ) -> dict[Key, _Tombstone]:
        """The tombstones of the keys just inserted; their rows are taken back out. A tombstone
        of a key that was not inserted (a row an earlier release wrote after the erasure) is
        left to that row."""
        if self._erased_hashes is None:
            if hits and hits[0][0] and inserted:
                raise ConfigError(
                    "ingest: erased operations exist and this store was not given the identity "
                    "keys to recognise them (bridge.keyring.attach); nothing was written"
                )
            return {}
        found = {
            Key(t, o): _Tombstone(bytes(h), State(st), th, bytes(oh).hex())
            for t, o, h, st, th, oh in hits
            if Key(t, o) in inserted
        }
        if found:
            conn.execute(sql.statement("ingest_erased_undo"), _keys_params(list(found)))
        return found

    def ingest_within_quota(
        self, batch: Sequence[Delivery | Rejection], quota: int, claim: InsertClaim | None = None
    ) -> list[IngestResult | QuotaDeferred]:
        """:meth:`ingest` under a tenant backlog quota, in one transaction.

        One statement counts the open rows (queued, claimed) of the batch's tenants, up to
        ``quota``. A tenant below it takes new operations up to what is left, in delivery
        order; the rest of its new operations are :class:`QuotaDeferred` (not written, not to be
        acknowledged). Keys that already exist are looked up first, so a replay or a conflict is
        decided as before whatever the backlog: they add no row.

        The count sees committed rows only. Writers that count the same tenant at once can each
        take what is left, so the open backlog can pass the quota by at most one batch per
        concurrent writer beyond the first; a single writer never passes it.
        """
        if quota < 1:
            raise ValueError(f"a tenant backlog quota is a number of rows, at least 1, not {quota}")
        firsts = _firsts(batch)
        with self._connection("ingest") as conn, conn.transaction():
            if not firsts:
                return list(self._ingest(conn, batch, claim))
            news: dict[str, list[Key]] = {}
            for key in firsts:
                news.setdefault(key.tenant_id, []).append(key)
            rows = conn.execute(
                sql.statement("tenant_backlog"), {"tenant_id": sorted(news), "cap": quota}
            ).fetchall()
            backlog = {t: int(n) for t, n in rows}
            # Only a tenant whose new keys could pass the quota needs to know which exist.
            tight = [k for t, keys in news.items() if backlog[t] + len(keys) > quota for k in keys]
            known: set[Key] = set()
            if tight:
                found = conn.execute(
                    sql.statement("ingest_existing"), _keys_params(tight)
                ).fetchall()
                known = {Key(t, o) for t, o, _, _ in found}
            left = {t: max(quota - n, 0) for t, n in backlog.items()}
            deferred: set[Key] = set()
            for key in tight:
                if key in known:
                    continue
                if left[key.tenant_id] > 0:
                    left[key.tenant_id] -= 1
                else:
                    deferred.add(key)
            admitted = [
                item for item in batch if not (isinstance(item, Delivery) and item.key in deferred)
            ]
            written = iter(self._ingest(conn, admitted, claim))
        return [
            QuotaDeferred(item.key, backlog[item.key.tenant_id])
            if isinstance(item, Delivery) and item.key in deferred
            else next(written)
            for item in batch
        ]

    def watch(self, keys: Sequence[Key]) -> dict[Key, tuple[State, bool]]:
        """State of each operation and whether its claim's lease is live (after_outcome acks)."""
        if not keys:
            return {}
        with self._connection("watch") as conn:
            rows = conn.execute(
                sql.statement("watch"), {**_keys_params(keys), "now": self._now()}
            ).fetchall()
        return {Key(t, o): (State(s), bool(live)) for t, o, s, live in rows}

    # -- claims ------------------------------------------------------------------------------

    def claim(
        self,
        worker: str,
        limit: int,
        lease: timedelta,
        *,
        job_types: Sequence[str] | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` claimable rows (queued and due, or expired with attempts left)."""
        if limit < 1:
            return []
        text, params, after = self._claim_request(worker, lease, limit, None, job_types)
        with self._connection("claim") as conn:
            rows = _execute(conn, text, params).fetchall()
        return self._claimed(rows, after)

    def claim_keys(self, worker: str, keys: Sequence[Key], lease: timedelta) -> list[Claim]:
        """Claim exactly these rows where they are claimable (hand-off after ingest)."""
        if not keys:
            return []
        text, params, after = self._claim_request(worker, lease, 0, keys, None)
        with self._connection("claim") as conn:
            rows = _execute(conn, text, params).fetchall()
        return self._claimed(rows, after)

    def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        worker: str,
        lease: timedelta,
        *,
        limit: int = 0,
        keys: Sequence[Key] | None = None,
        job_types: Sequence[str] | None = None,
    ) -> SettledClaim:
        """See :meth:`~bridge.store.work.WorkStore.settle_and_claim`: the claim sees the rows
        the settlements freed (the next row of an ordered group, a slot under a limit), and
        each row still moves only under its own fence, inside its statement. A claim the server
        refuses rolls the whole transaction back before it commits, so the settlements are then
        written alone; a broken connection leaves the outcome unknown and raises, as a failed
        settlement does."""
        _settled_only(settlements, "settle_and_claim")
        if not settlements:
            if keys:
                return SettledClaim([], self.claim_keys(worker, keys, lease))
            return SettledClaim([], self.claim(worker, limit, lease, job_types=job_types))
        if not keys and limit < 1:
            return SettledClaim(self.settle_many(settlements), [])
        text, params, after = self._claim_request(worker, lease, limit, keys, job_types)
        settled: psycopg.Cursor[tuple[Any, ...]] | None = None
        try:
            with self._connection("settle and claim") as conn:
                # One pipeline, one Sync: the two statements go out in one round trip and run
                # as one implicit transaction, which the Sync commits, or rolls back whole
                # once either fails (no BEGIN, no COMMIT, no round trip of their own).
                with conn.pipeline():
                    settled = conn.execute(
                        sql.statement("settle_many"),
                        _settlements_params(settlements, self._now(), self._history),
                    )
                    claimed = _execute(conn, text, params)
                moved = settled.fetchall()
                rows = claimed.fetchall()
        except Exception as exc:
            if not _only_the_claim_failed(settled, exc):
                raise  # the settlement failed, or the outcome is unknown: the batch's error
            # The server refused the claim on a live connection: nothing of the transaction
            # committed, the settlements included; they are written alone.
            return SettledClaim(self.settle_many(settlements), [], exc)
        return SettledClaim(
            _stale([s.ticket for s in settlements], moved), self._claimed(rows, after)
        )

    def _claim_request(
        self,
        worker: str,
        lease: timedelta,
        limit: int,
        keys: Sequence[Key] | None,
        job_types: Sequence[str] | None,
    ) -> tuple[LiteralString, dict[str, Any], str | None]:
        """The statement claiming ``keys`` (else up to ``limit`` rows of ``job_types``), its
        parameters, and the tenant a tenant-fair claim walks from (None for the others)."""
        common = {
            "worker": worker,
            "lease": lease,
            "identity_keys": self._identity_keys,
            "history": self._history,
            "now": self._now(),
        }
        if keys:
            limits = self._limits(None)
            text = (
                sql.with_limit("claim_keys", len(keys))
                if limits is None
                else sql.statement("claim_keys_limited")
            )
            return text, {**common, **_keys_params(keys), **_limit_params(limits)}, None
        limits = self._limits(job_types)
        text, extra = self._claim_statement(limits, limit)
        params = {
            **common,
            "limit": limit,
            "job_types": list(job_types) if job_types is not None else None,
            **_limit_params(limits),
            **extra,
        }
        return text, params, extra.get("after")

    def _claimed(self, rows: Sequence[tuple[Any, ...]], after: str | None) -> list[Claim]:
        claims = [_claim(r) for r in rows]
        if self._fair is not None and after is not None:
            self._fair.served(after, claims)
        return claims

    # -- fenced writes -----------------------------------------------------------------------

    def heartbeat(self, ticket: Ticket, lease: timedelta) -> datetime:
        """Extend the lease under the fence; returns the new expiry or raises LeaseLost."""
        expires = self._fenced_write("heartbeat", "heartbeat", ticket, lease=lease)[0]
        assert isinstance(expires, datetime)
        return expires

    def heartbeat_many(self, tickets: Sequence[Ticket], lease: timedelta) -> list[Ticket]:
        """Extend many leases in one statement; returns the tickets whose fence was stale."""
        if not tickets:
            return []
        with self._connection("heartbeat") as conn:
            rows = conn.execute(
                sql.statement("heartbeat_many"),
                {**_tickets_params(tickets), "lease": lease, "now": self._now()},
            ).fetchall()
        return _stale(tickets, rows)

    # Every settlement also ends the claim's attempt record, in the same statement; ``error``
    # (an exception's class name, never its text) and ``finding`` (what a lookup by
    # idempotency key found) go there only.

    def complete(
        self,
        ticket: Ticket,
        outcome_code: str = "ok",
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """Mark the operation succeeded under the fence."""
        self._settle(ticket, State.SUCCEEDED, outcome_code, detail, error=error, finding=finding)

    def fail_terminal(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """A confirmed failure that retrying cannot fix."""
        self._settle(
            ticket, State.FAILED_TERMINAL, outcome_code, detail, error=error, finding=finding
        )

    def park_unknown(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """The outcome cannot be confirmed: park for reconciliation, never guess."""
        self._settle(ticket, State.UNKNOWN, outcome_code, detail, error=error, finding=finding)

    def quarantine(
        self,
        ticket: Ticket,
        outcome_code: str,
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """The input cannot be interpreted with confidence: park for the producer team."""
        self._settle(ticket, State.QUARANTINED, outcome_code, detail, error=error, finding=finding)

    def _settle(
        self,
        ticket: Ticket,
        state: State,
        code: str,
        detail: str | None,
        *,
        error: str | None,
        finding: str | None,
    ) -> None:
        self._fenced_write(
            f"settle as {state.value}",
            "settle",
            ticket,
            state=state.value,
            outcome_code=code,
            outcome_detail=detail,
            error_class=error,
            finding=finding,
        )

    def settle_many(self, settlements: Sequence[Settlement]) -> list[Ticket]:
        """Settle many claims in one statement; returns the tickets whose fence was stale."""
        if not settlements:
            return []
        _settled_only(settlements, "settle_many")
        with self._connection("settle") as conn:
            rows = conn.execute(
                sql.statement("settle_many"),
                _settlements_params(settlements, self._now(), self._history),
            ).fetchall()
        return _stale([s.ticket for s in settlements], rows)

    def complete_many(self, tickets: Sequence[Ticket], outcome_code: str = "ok") -> list[Ticket]:
        """Mark many operations succeeded; returns the tickets whose fence was stale."""
        return self.settle_many([Settlement(t, State.SUCCEEDED, outcome_code) for t in tickets])

    def retry_later(
        self,
        ticket: Ticket,
        backoff: timedelta,
        outcome_code: str = "retry",
        detail: str | None = None,
        *,
        error: str | None = None,
        finding: str | None = None,
    ) -> State:
        """Back to the queue after ``backoff``; ``failed_terminal`` when no attempt is left.

        Only for attempts that confirmed nothing was applied. Returns the state the row took.
        """
        row = self._fenced_write(
            "retry later",
            "retry_later",
            ticket,
            backoff=backoff,
            outcome_code=outcome_code,
            outcome_detail=detail,
            error_class=error,
            finding=finding,
        )
        return State(row[0])

    def record_intent(self, ticket: Ticket) -> None:
        """Record, under the fence, that this claim is about to call a class D target."""
        self._fenced_write("record intent", "record_intent", ticket)

    def release(self, ticket: Ticket) -> None:
        """Give back a claim whose handler never started; the attempt is not counted."""
        self._fenced_write("release", "release", ticket)

    @contextmanager
    def fenced_transaction(
        self, ticket: Ticket, *, deadline: timedelta | None = None
    ) -> Iterator[PostgresFencedTransaction]:
        """Open a transaction holding the work row's lock under the fence (target class A).

        Raises LeaseLost before yielding if the claim is gone. The business write and the
        transaction's ``settle`` commit together when the block exits cleanly; any exception
        rolls both back.

        With a ``deadline`` the transaction never outlives it: its statements and idle gaps
        are limited to it, a statement still running when it passes is cancelled, and a block
        that ends after it is rolled back instead of committed. Each of these raises
        :class:`~bridge.deadline.DeadlineExceeded`: rolled back, nothing was applied.
        """
        with self._connection("fenced transaction") as conn:
            watch: TransactionDeadline | None = None
            try:
                with conn.transaction():
                    row = conn.execute(
                        sql.statement("lock_claim"), _ticket_params(ticket)
                    ).fetchone()
                    if row is None:
                        raise _lost(ticket, "lock")
                    if deadline is None:
                        yield PostgresFencedTransaction(
                            conn, ticket, self._now(), history=self._history
                        )
                        return
                    bound = str(milliseconds(deadline))
                    conn.execute(
                        sql.statement("transaction_limits"),
                        {"statement_timeout": bound, "idle_timeout": bound},
                    )
                    with TransactionDeadline(conn, deadline) as watch:
                        yield PostgresFencedTransaction(
                            conn, ticket, self._now(), watch, history=self._history
                        )
                        watch.finish()  # past the deadline: raise, so nothing commits
            except psycopg.Error as exc:
                # Cancelled, timed out or cut off by the server because the deadline passed:
                # whatever the driver says, the transaction did not commit.
                if watch is not None and watch.expired:
                    raise DeadlineExceeded(watch.deadline) from exc
                raise

    # -- maintenance -------------------------------------------------------------------------

    def sweep(self, limit: int = SWEEP_LIMIT_DEFAULT, *, exclusive: bool = False) -> Swept:
        """Park expired claims with no attempt left as ``unknown``, except class D claims that
        never recorded an intent (no call was made), which go back to the queue while the row
        has had fewer than :data:`~bridge.store.work.UNSTARTED_CLAIMS_MAX` claims.

        With ``exclusive``, the sweep runs only if no other process is sweeping right now
        (a transaction-scoped advisory lock); otherwise it does nothing at once.
        """
        with self._connection("sweep") as conn, conn.transaction():
            if exclusive:
                got = conn.execute(sql.statement("sweep_lock")).fetchone()
                if not got or not got[0]:
                    return Swept([], [])
            rows = conn.execute(
                sql.statement("sweep"),
                {
                    "limit": limit,
                    "now": self._now(),
                    "history": self._history,
                    "aging": self._aging,
                    "unstarted_claims": UNSTARTED_CLAIMS_MAX,
                },
            ).fetchall()
        swept = Swept([], [])
        for t, o, f, state in rows:
            (swept.requeued if state == State.QUEUED else swept.parked).append(Ticket(t, o, int(f)))
        return swept

    def redrive(
        self,
        selection: RedriveFilter,
        *,
        actor: str,
        reason: str,
        extra_attempts: int = 1,
        dry_run: bool = False,
    ) -> list[Redriven]:
        """Send parked rows back to the queue, identity intact, each move audited.

        The rows keep their attempt count, so their next claim reconciles before acting. With
        ``dry_run`` the same statement runs and is rolled back: the answer is exactly what a
        real run would have moved at that moment.
        """
        if extra_attempts < 1:
            raise ValueError("a redrive must grant at least one attempt")
        if not actor or not reason:
            raise ValueError("a redrive needs an actor and a reason for the audit record")
        params = {
            **_selection_params(selection),
            "extra_attempts": extra_attempts,
            "actor": actor,
            "reason": reason,
            "now": self._now(),
            "aging": self._aging,
        }
        with self._connection("redrive") as conn, conn.transaction(force_rollback=dry_run):
            rows = conn.execute(sql.statement("redrive"), params).fetchall()
        return [Redriven(Key(t, o), State(s), int(f), int(a)) for t, o, s, f, a in rows]

    def stats(self) -> Stats:
        """Counts by subscription, tenant and state; stalled claims; the oldest unknown."""
        return self._stats("stats_counts")

    def open_stats(self) -> Stats:
        """:meth:`stats` with the counts of open and parked rows only (never the succeeded or
        failed history): what the database gauges read at every refresh."""
        return self._stats("stats_open")

    def _stats(self, counting: str) -> Stats:
        with self._connection("stats") as conn:
            counts = conn.execute(sql.statement(counting)).fetchall()
            health = conn.execute(sql.statement("stats_health"), {"now": self._now()}).fetchone()
        assert health is not None
        stalled, oldest, conflicts, quarantined = health
        return Stats(
            counts=tuple(StateCount(sub, t, State(s), int(n)) for sub, t, s, n in counts),
            stalled_claims=int(stalled),
            oldest_unknown_seconds=float(oldest) if oldest is not None else None,
            rejected={"conflict": int(conflicts), "quarantined": int(quarantined)},
        )

    # -- operator commands -------------------------------------------------------------------

    def history(self, key: Key) -> OperationHistory:
        """The work row, its attempts, its redrives and its rejected deliveries, in one
        read-only snapshot."""
        params = {"tenant_id": key.tenant_id, "operation_id": key.operation_id}
        with self._connection("inspect") as conn, conn.transaction():
            conn.execute(sql.statement("inspect_snapshot"))
            row = conn.execute(sql.statement("inspect_row"), params).fetchone()
            audits = conn.execute(sql.statement("inspect_audit"), params).fetchall()
            rejected = conn.execute(sql.statement("inspect_rejected"), params).fetchall()
            attempts = conn.execute(sql.statement("inspect_attempts"), params).fetchall()
        return OperationHistory(
            key=key,
            row=_work_record(row) if row is not None else None,
            redrives=tuple(
                RedriveRecord(
                    at=at,
                    actor=actor,
                    reason=reason,
                    from_state=f,
                    to_state=to,
                    fence=fe,
                    attempts=att,
                )
                for at, actor, reason, f, to, fe, att in audits
            ),
            rejected=tuple(_rejected_record(r) for r in rejected),
            attempts=tuple(_attempt_record(r) for r in attempts),
        )

    def erasures(self, tenant_hash: str, operation_hash: str | None = None) -> list[ErasureRecord]:
        """The recorded erasures of the tenant with this keyed hash (and of the operation with
        this one), newest first."""
        with self._connection("inspect") as conn:
            rows = conn.execute(
                sql.statement("inspect_erasures"),
                {"tenant_hash": tenant_hash, "operation_hash": operation_hash},
            ).fetchall()
        return [ErasureRecord(at, actor, reason, bool(one)) for at, actor, reason, one in rows]

    def parked(self, selection: RedriveFilter) -> list[ParkedRow]:
        """The parked rows a redrive with this selection would consider, oldest first."""
        with self._connection("redrive") as conn:
            rows = conn.execute(
                sql.statement("redrive_candidates"), _selection_params(selection)
            ).fetchall()
        return [_parked_row(r) for r in rows]

    def quarantined_deliveries(self, selection: RedriveFilter) -> list[QuarantinedDelivery]:
        """Quarantined deliveries not yet redriven that match the selection, oldest first."""
        with self._connection("redrive") as conn:
            rows = conn.execute(
                sql.statement("rejected_candidates"), _selection_params(selection)
            ).fetchall()
        return [
            QuarantinedDelivery(
                id=int(i),
                subscription=s,
                broker_message_id=m,
                tenant_id=t,
                operation_id=o,
                job_type=j,
                reason=reason,
                body=bytes(body) if body is not None else None,
            )
            for i, s, m, t, o, j, reason, body in rows
        ]

    def redrive_applied(
        self,
        row: ParkedRow,
        *,
        outcome_code: str,
        outcome_detail: str | None,
        actor: str,
        reason: str,
        dry_run: bool = False,
    ) -> bool:
        """Unknown class C row whose lookup found the effect: succeeded, audited.

        False when the row is no longer unknown under the fence the lookup was made for.
        """
        params = {
            **_parked_params(row),
            "outcome_code": outcome_code,
            "outcome_detail": outcome_detail,
            "actor": actor,
            "reason": reason,
        }
        return self._guarded_write("redrive_applied", params, dry_run=dry_run)

    def rate_waits(self, job_type: str | None = None) -> list[RateWait]:
        """The targets' rate limit waits still ahead (of one job type), latest end first."""
        with self._connection("rate waits") as conn:
            rows = conn.execute(
                sql.statement("rate_waits"), {"job_type": job_type, "now": self._now()}
            ).fetchall()
        return [RateWait(j, t, until, int(n)) for j, t, until, n in rows]

    def lift_rate_waits(
        self,
        job_type: str,
        tenant_id: str | None = None,
        *,
        actor: str,
        reason: str,
        dry_run: bool = False,
    ) -> list[LiftedWait]:
        """Delete the waits still ahead of the job type (and tenant), and make due now the
        queued rows each had scheduled, every such row audited (``rate_wait_lift.sql``). A dry
        run executes the same statement and rolls it back."""
        if not actor or not reason:
            raise ValueError("lifting a wait needs an actor and a reason for the audit record")
        params = {
            "job_type": job_type,
            "tenant_id": tenant_id,
            "actor": actor,
            "reason": reason,
            "now": self._now(),
            "aging": self._aging,
        }
        with self._connection("rate waits") as conn, conn.transaction(force_rollback=dry_run):
            rows = conn.execute(sql.statement("rate_wait_lift"), params).fetchall()
        return [LiftedWait(j, t, until, int(n)) for j, t, until, n in rows]

    def redrive_unfenced(
        self,
        row: ParkedRow,
        *,
        actor: str,
        reason: str,
        extra_attempts: int = 1,
        dry_run: bool = False,
    ) -> bool:
        """Unknown class D row confirmed not called: queued with its intent cleared, audited.

        False when the row is no longer unknown under the fence the operator confirmed.
        """
        if extra_attempts < 1:
            raise ValueError("a redrive must grant at least one attempt")
        params = {
            **_parked_params(row),
            "extra_attempts": extra_attempts,
            "actor": actor,
            "reason": reason,
        }
        return self._guarded_write("redrive_unfenced", params, dry_run=dry_run)

    def close_rejected(
        self,
        rejected_id: int,
        *,
        outcome: Decision,
        actor: str,
        reason: str,
        dry_run: bool = False,
    ) -> bool:
        """Mark a quarantined delivery redriven with what the inbox made of it; False if it
        was already closed."""
        if outcome not in (Decision.NEW, Decision.REPLAY, Decision.CONFLICT):
            raise ValueError("only a delivery that reached the inbox can be closed")
        params = {"id": rejected_id, "outcome": outcome.value, "actor": actor, "reason": reason}
        return self._guarded_write("rejected_redriven", params, dry_run=dry_run)

    def resolve_rejected(
        self,
        *,
        actor: str,
        reason: str,
        ids: Sequence[int] | None = None,
        kind: str | None = None,
        subscription: str | None = None,
        tenant_id: str | None = None,
        operation_id: str | None = None,
        limit: int = 100,
        dry_run: bool = False,
    ) -> list[ResolvedDelivery]:
        """Close open rejected deliveries a person has dealt with, recording who and why; the
        work rows are untouched. A dry run executes the same statement and rolls back."""
        if not actor or not reason:
            raise ValueError("a resolve needs an actor and a reason for the audit record")
        params = {
            "ids": list(ids) if ids is not None else None,
            "kind": kind,
            "subscription": subscription,
            "tenant_id": tenant_id,
            "operation_id": operation_id,
            "limit": limit,
            "actor": actor,
            "reason": reason,
            "now": self._now(),
        }
        with self._connection("resolve") as conn, conn.transaction(force_rollback=dry_run):
            rows = conn.execute(sql.statement("resolve_rejected"), params).fetchall()
        return [
            ResolvedDelivery(
                id=int(i),
                kind=k,
                subscription=sub,
                key=Key(t, o) if t is not None and o is not None else None,
                created_at=at,
            )
            for i, k, sub, t, o, at in rows
        ]

    def rejected_status(self, ids: Sequence[int]) -> list[RejectedStatus]:
        """Where the named rejected deliveries stand; an id absent from the answer is not in
        the database (never recorded, purged or erased)."""
        with self._connection("resolve") as conn:
            rows = conn.execute(sql.statement("rejected_status"), {"ids": list(ids)}).fetchall()
        return [RejectedStatus(int(i), *rest) for i, *rest in rows]

    def purge_batch(
        self,
        older_than: timedelta,
        limit: int,
        *,
        tombstone_horizon: timedelta = timedelta(days=TOMBSTONE_DAYS_DEFAULT),
    ) -> PurgeCounts | None:
        """Remove one bounded batch of finished work older than ``older_than``, of tombstones
        older than ``tombstone_horizon``, of what shadow subscriptions recorded before
        ``older_than``, and of token buckets full for longer than ``older_than`` (the same as
        no bucket; not counted).

        Returns None, having removed nothing, when another purge holds the purge lock.
        """
        if limit < 1:
            raise ValueError("a purge batch must remove at least one row")
        params = {"older_than": older_than, "limit": limit, "now": self._now()}
        with self._connection("purge") as conn, conn.transaction():
            got = conn.execute(sql.statement("purge_lock")).fetchone()
            if not got or not got[0]:
                return None
            row = conn.execute(sql.statement("purge"), params).fetchone()
            gone = conn.execute(
                sql.statement("purge_tombstones"), {**params, "horizon": tombstone_horizon}
            ).fetchone()
            shadow = conn.execute(sql.statement("purge_shadow"), params).fetchone()
            conn.execute(sql.statement("purge_buckets"), params)
        assert row is not None
        assert gone is not None
        assert shadow is not None
        return PurgeCounts(*(int(n) for n in (*row, *gone, *shadow)))

    def purge_preview(
        self,
        older_than: timedelta,
        *,
        tombstone_horizon: timedelta = timedelta(days=TOMBSTONE_DAYS_DEFAULT),
    ) -> PurgeCounts:
        """What a purge with this age (and tombstone horizon) would remove right now."""
        params = {"older_than": older_than, "now": self._now()}
        with self._connection("purge") as conn:
            row = conn.execute(sql.statement("purge_count"), params).fetchone()
            gone = conn.execute(
                sql.statement("purge_tombstones_count"),
                {"horizon": tombstone_horizon, "now": self._now()},
            ).fetchone()
            shadow = conn.execute(sql.statement("purge_shadow_count"), params).fetchone()
        assert row is not None
        assert gone is not None
        assert shadow is not None
        return PurgeCounts(*(int(n) for n in (*row, *gone, *shadow)))

    def erase(
        self,
        tenant_id: str,
        *,
        operation_id: str | None = None,
        tenant_hash: str,
        operation_hash: str | None = None,
        actor: str,
        reason: str,
        dry_run: bool = False,
        drop_parked_messages: bool = False,
    ) -> ErasureCounts:
        """Erase one tenant (or one of its operations): rows, payloads, rejected deliveries,
        audit rows and sent outbox messages go, a tombstone per operation stays (keyed hash
        under every identity key held, payload hash, state, outcome code), recorded by hashes
        only, in one transaction (rolled back on a dry run).

        A bridge started before a key rotation looks tombstones up under the old key alone, so
        each one is hashed under every key this process holds; the database marks the recorded
        keys the erasure left out, and an inbox whose keys are all marked refuses to write new
        work (:class:`~bridge.errors.IdentityKeysOutdated`) until restarted with the current
        key.

        Refuses, changing nothing (:class:`~bridge.errors.ErasureRefused`), while a row in scope
        is queued or claimed, an outbox message in scope is pending (committed, not sent yet)
        or, unless ``drop_parked_messages``, parked, or this process does not hold the
        database's current identity key. Needs the identity keys bound
        (:func:`bridge.keyring.attach`): the tombstones are keyed hashes.
        """
        if not tenant_id or not tenant_hash or not actor or not reason:
            raise ValueError("an erasure needs a tenant, its hash, an actor and a reason")
        if operation_id is not None and not (operation_id and operation_hash):
            raise ValueError("an erasure of one operation needs its id and its hash")
        derive, keys = self._erased_hashes, self._identity_keys
        if derive is None or not keys:
            raise ConfigError(
                "erase: the identity keys are not bound (bridge.keyring.attach): tombstones "
                "are keyed hashes"
            )
        scope = {"tenant_id": tenant_id, "operation_id": operation_id}
        with self._connection("erase") as conn, conn.transaction(force_rollback=dry_run):
            # It may touch every row of a large tenant: it must finish, so it runs without the
            # session's statement limit (lock waits stay bounded).
            conn.execute(
                sql.statement("transaction_limits"),
                {"statement_timeout": "0", "idle_timeout": None},
            )
            ids = [o for (o,) in conn.execute(sql.statement("erase_scope"), scope).fetchall()]
            held = sorted(keys)
            hashes: list[bytes] = []
            for o in ids:
                by_key = dict(derive(tenant_id, o))
                hashes.extend(by_key[k] for k in held)
            try:
                row = conn.execute(
                    sql.statement("erase"),
                    {
                        **scope,
                        "tenant_hash": tenant_hash,
                        "operation_hash": operation_hash,
                        "key_ids": held,
                        "operation_ids": ids,
                        "operation_hashes": hashes,
                        "actor": actor,
                        "reason": reason,
                        "drop_parked": drop_parked_messages,
                    },
                ).fetchone()
            except psycopg.DatabaseError as exc:
                if exc.sqlstate not in ERASURE_REFUSALS:
                    raise
                hint = exc.diag.message_hint
                raise ErasureRefused(
                    f"{exc.diag.message_primary}" + (f"; {hint}" if hint else "")
                ) from exc
        assert row is not None
        rows, payloads, rejected, audits, tombstones, sent, parked, missed = row
        return ErasureCounts(
            work_rows=int(rows),
            payloads=int(payloads),
            rejected_deliveries=int(rejected),
            redrive_audits=int(audits),
            tombstones=int(tombstones),
            outbox_sent=int(sent),
            outbox_parked=int(parked),
            tombstone_keys=tuple(held),
            missed_keys=tuple(int(k) for k in missed),
        )

    # -- shadow subscriptions ----------------------------------------------------------------

    def shadow_decisions(self, subscriptions: Sequence[str]) -> list[tuple[str | None, str, int]]:
        """(job type, decision, deliveries) of what these shadow subscriptions recorded."""
        with self._connection("shadow report") as conn:
            rows = conn.execute(
                sql.statement("shadow_decisions"), {"subscription": list(subscriptions)}
            ).fetchall()
        return [(j, d, int(n)) for j, d, n in rows]

    def shadow_operations(
        self, subscriptions: Sequence[str], *, page: int = SHADOW_PAGE_DEFAULT
    ) -> Generator[SeenOperation, None, None]:
        """The operations these shadow subscriptions recorded, one per operation with the
        payload hash it was first seen with, in key order (code point order of tenant, then
        operation), ``page`` rows per round trip: :meth:`_held_pages`."""
        rows = self._held_pages(
            "shadow_operations",
            sql.statement("shadow_operations"),
            {"subscription": list(subscriptions)},
            page,
        )
        for t, o, j, h in rows:
            yield SeenOperation(Key(t, o), j, bytes(h))

    def effect_table(
        self, name: str, *, page: int = SHADOW_PAGE_DEFAULT
    ) -> Generator[dict[str, Any], None, None]:
        """Every row of the table or view ``name`` (``schema.table`` or ``table``) as a dict,
        in the key order of :meth:`shadow_operations`, ``page`` rows per round trip: an effect
        log the existing system keeps in this database."""
        parts = name.split(".")
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise ConfigError(f"an effect table is named table or schema.table, not {name!r}")
        query = psycopg.sql.SQL(sql.statement("shadow_effects_table")).format(
            effects=psycopg.sql.Identifier(*parts)
        )
        missing = f"shadow report: no table or view {name!r}"
        for (row,) in self._held_pages("shadow_effects", query, {}, page, missing=missing):
            yield dict(row)

    def _held_pages(
        self,
        name: str,
        query: Query,
        params: Mapping[str, Any],
        page: int,
        *,
        missing: str | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of a report's query, ``page`` at a time, from a cursor held on the server
        (``WITH HOLD``): the client keeps one page, and no transaction stays open while it
        works through one, so neither the idle transaction limit nor a snapshot held back
        from vacuum depends on how long the report takes. The server keeps the result until
        the cursor closes (with the generator, or the session). ``missing``: the error when
        the query names a table that does not exist (an operator's table)."""
        if page < 1:
            raise ValueError(f"a page holds at least one row, not {page}")
        with (
            self._connection("shadow report") as conn,
            conn.cursor(name=name, withhold=True) as cursor,
        ):
            try:
                cursor.execute(query, params)
            except psycopg.errors.UndefinedTable as exc:
                if missing is None:
                    raise
                raise ConfigError(missing) from exc
            while rows := cursor.fetchmany(page):
                yield from rows

    def shadow_clear(self, subscription: str) -> tuple[int, int]:
        """Forget one shadow subscription's record: (operations, deliveries) removed."""
        with self._connection("shadow clear") as conn, conn.transaction():
            row = conn.execute(
                sql.statement("shadow_clear"), {"subscription": subscription}
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    # -- console lists -----------------------------------------------------------------------

    def group_counts(self) -> list[GroupCount]:
        """Counts by subscription, job type, tenant and state (the console's counts)."""
        with self._connection("console") as conn:
            rows = conn.execute(sql.statement("console_counts")).fetchall()
        return [GroupCount(sub, job, t, State(s), int(n)) for sub, job, t, s, n in rows]

    def rows_page(
        self,
        state: State,
        *,
        after: int = 0,
        limit: int = 50,
        subscription: str | None = None,
        job_type: str | None = None,
    ) -> list[RowSummary]:
        """Rows in ``state`` with a ``seq`` greater than ``after``, in ``seq`` order."""
        params = {
            "state": state.value,
            "after": after,
            "limit": limit,
            "subscription": subscription,
            "job_type": job_type,
        }
        with self._connection("console") as conn:
            rows = conn.execute(sql.statement("console_rows"), params).fetchall()
        return [_row_summary(r) for r in rows]

    def rejected_page(
        self, *, after: int = 0, limit: int = 50, kind: str | None = None, open_only: bool = False
    ) -> list[RejectedSummary]:
        """Rejected deliveries with an id greater than ``after``, in id order."""
        params = {"after": after, "limit": limit, "kind": kind, "open_only": open_only}
        with self._connection("console") as conn:
            rows = conn.execute(sql.statement("console_rejected"), params).fetchall()
        return [_rejected_summary(r) for r in rows]

    # -- console figures and the audited payload view ----------------------------------------

    def figures(self, *, buckets: int, bucket: timedelta) -> list[FigurePoint]:
        """The dashboard's figures at the end of each of ``buckets`` buckets of ``bucket``
        up to now, oldest first."""
        params = {
            "now": self._now(),
            "buckets": buckets,
            "bucket_seconds": bucket.total_seconds(),
        }
        with self._connection("console") as conn:
            rows = conn.execute(sql.statement("console_figures"), params).fetchall()
        return [
            FigurePoint(
                at=at,
                stalled=int(stalled),
                oldest_unknown_seconds=float(oldest) if oldest is not None else None,
                quarantined=int(quarantined),
                takeovers=int(takeovers),
            )
            for at, stalled, oldest, quarantined, takeovers in rows
        ]

    def view_payload(self, key: Key, *, actor: str, reason: str) -> PayloadView | None:
        """One operation's payload bytes, audited in the same statement; None: no such row
        (and nothing audited)."""
        params = {
            "tenant_id": key.tenant_id,
            "operation_id": key.operation_id,
            "actor": actor,
            "reason": reason,
            "now": self._now(),
        }
        with self._connection("payload view") as conn:
            row = conn.execute(sql.statement("console_payload_view"), params).fetchone()
        if row is None:
            return None
        body, at = row
        return PayloadView(key=key, body=bytes(body) if body is not None else None, viewed_at=at)

    # -- rate limits -------------------------------------------------------------------------

    def rate_limited(
        self,
        ticket: Ticket,
        retry_after: timedelta,
        outcome_code: str = "rate_limited",
        *,
        detail: str | None = None,
        error: str | None = None,
        finding: str | None = None,
    ) -> None:
        """Back to the queue after ``retry_after`` (database clock) with the attempt given back,
        and the row's (job type, tenant) waiting as long: claims skip that key until then.

        Fenced like every settlement; raises LeaseLost, changing nothing, for a stale ticket.
        """
        self._fenced_write(
            "rate limited",
            "rate_limited",
            ticket,
            retry_after=retry_after,
            outcome_code=outcome_code,
            outcome_detail=detail,
            error_class=error,
            finding=finding,
        )

    # -- concurrency limits and token rates -----------------------------------------------------

    def waiting(
        self,
        limits: Mapping[str, ConcurrencyLimit] | None = None,
        rates: Mapping[str, TokenRate] | None = None,
    ) -> list[WaitingCount]:
        """Queued rows that are due and yet not claimable, per job type, tenant and reason:
        ``rate`` (a rate limit wait, or no whole token in a bucket of ``rates``) or ``limit``
        (over a concurrency limit of ``limits``); the store's own limits and rates where not
        given. A row waiting for both counts as ``rate``."""
        given = self._concurrency if limits is None else limits
        slots = {
            job: [limit.total, limit.per_tenant] for job, limit in given.items() if limit.limited
        }
        rated = self._rates if rates is None else rates
        buckets = {job: rate.buckets() for job, rate in rated.items() if rate.limited}
        with self._connection("waiting") as conn:
            rows = conn.execute(
                sql.statement("waiting"),
                {
                    "slots": Jsonb(slots) if slots else None,
                    "rates": Jsonb(buckets) if buckets else None,
                    "now": self._now(),
                },
            ).fetchall()
        return [WaitingCount(job, tenant, reason, int(n)) for job, tenant, reason, n in rows]


@dataclass(frozen=True, slots=True)
class _Limits:
    """A limited claim's ``%(slots)s`` and ``%(rates)s`` (None where it has none)."""

    slots: Jsonb | None
    rates: Jsonb | None


def _limit_params(limits: _Limits | None) -> dict[str, Any]:
    if limits is None:
        return {"slots": None, "rates": None}
    return {"slots": limits.slots, "rates": limits.rates}


def _selection_params(selection: RedriveFilter) -> dict[str, Any]:
    keys = selection.keys
    return {
        "states": [s.value for s in selection.states],
        "subscription": selection.subscription,
        "tenant_id": selection.tenant_id,
        "job_type": selection.job_type,
        "key_tenant_id": [k.tenant_id for k in keys] if keys is not None else None,
        "key_operation_id": [k.operation_id for k in keys] if keys is not None else None,
        "key_fence": list(selection.fences) if selection.fences is not None else None,
        "limit": selection.limit,
    }


def _work_record(row: tuple[Any, ...]) -> WorkRecord:
    (
        subscription,
        job_type,
        target_class,
        schema_version,
        state,
        fence,
        attempts,
        max_attempts,
        lease_owner,
        lease_expires_at,
        next_attempt_at,
        intent_fence,
        outcome_code,
        outcome_detail,
        payload_hash,
        broker_message_id,
        receive_count,
        ordering_key,
        created_at,
        claimed_at,
        settled_at,
        updated_at,
        payload_bytes,
        trace_context,
    ) = row
    return WorkRecord(
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        schema_version=schema_version,
        state=State(state),
        fence=int(fence),
        attempts=int(attempts),
        max_attempts=int(max_attempts),
        lease_owner=lease_owner,
        lease_expires_at=lease_expires_at,
        next_attempt_at=next_attempt_at,
        intent_fence=intent_fence,
        outcome_code=outcome_code,
        outcome_detail=outcome_detail,
        payload_hash=bytes(payload_hash),
        broker_message_id=broker_message_id,
        receive_count=receive_count,
        ordering_key=ordering_key,
        created_at=created_at,
        claimed_at=claimed_at,
        settled_at=settled_at,
        updated_at=updated_at,
        payload_bytes=int(payload_bytes) if payload_bytes is not None else None,
        trace_context=trace_context,
    )


def _attempt_record(row: tuple[Any, ...]) -> AttemptRecord:
    kind, fence, worker, takeover, started, ended, outcome, code, error, finding = row
    return AttemptRecord(
        kind=kind,
        fence=int(fence),
        worker=worker,
        takeover=bool(takeover),
        started_at=started,
        ended_at=ended,
        outcome=outcome,
        outcome_code=code,
        error_class=error,
        finding=finding,
    )


def _rejected_record(row: tuple[Any, ...]) -> RejectedRecord:
    (
        rejected_id,
        kind,
        reason,
        subscription,
        broker_message_id,
        payload_hash,
        created_at,
        redriven_at,
        redriven_by,
        redrive_reason,
        redrive_outcome,
        resolved_at,
        resolved_by,
        resolution_reason,
    ) = row
    return RejectedRecord(
        id=int(rejected_id),
        kind=kind,
        reason=reason,
        subscription=subscription,
        broker_message_id=broker_message_id,
        payload_hash=bytes(payload_hash) if payload_hash is not None else None,
        created_at=created_at,
        redriven_at=redriven_at,
        redriven_by=redriven_by,
        redrive_reason=redrive_reason,
        redrive_outcome=redrive_outcome,
        resolved_at=resolved_at,
        resolved_by=resolved_by,
        resolution_reason=resolution_reason,
    )


def _parked_row(row: tuple[Any, ...]) -> ParkedRow:
    (
        tenant_id,
        operation_id,
        state,
        subscription,
        job_type,
        target_class,
        schema_version,
        fence,
        attempts,
        max_attempts,
        intent_fence,
        payload,
        identity_key_id,
    ) = row
    return ParkedRow(
        key=Key(tenant_id, operation_id),
        state=State(state),
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        schema_version=schema_version,
        fence=int(fence),
        attempts=int(attempts),
        max_attempts=int(max_attempts),
        intent_fence=intent_fence,
        payload=bytes(payload) if payload is not None else None,
        identity_key_id=int(identity_key_id),
    )


def _lost(ticket: Ticket, action: str) -> LeaseLost:
    return LeaseLost(ticket.tenant_id, ticket.operation_id, ticket.fence, action)


def _ticket_params(ticket: Ticket) -> dict[str, Any]:
    return {
        "tenant_id": ticket.tenant_id,
        "operation_id": ticket.operation_id,
        "fence": ticket.fence,
    }


def _tickets_params(tickets: Sequence[Ticket]) -> dict[str, Any]:
    return {
        "tenant_id": [t.tenant_id for t in tickets],
        "operation_id": [t.operation_id for t in tickets],
        "fence": [t.fence for t in tickets],
    }


def _keys_params(keys: Sequence[Key]) -> dict[str, Any]:
    return {
        "tenant_id": [k.tenant_id for k in keys],
        "operation_id": [k.operation_id for k in keys],
    }


def _parked_params(row: ParkedRow) -> dict[str, Any]:
    """The parked row's key and the fence the operator's decision was made under."""
    return {
        "tenant_id": row.key.tenant_id,
        "operation_id": row.key.operation_id,
        "fence": row.fence,
    }


def _execute(
    conn: Connection, text: LiteralString, params: Mapping[str, Any]
) -> psycopg.Cursor[tuple[Any, ...]]:
    """Run one of the store's statements; a text past psycopg's conversion cache (the claims of
    limited job types) goes positional through a raw cursor, converted once
    (:func:`bridge.sql.positional`), instead of being scanned again at every execution."""
    if len(text) <= sql.CACHED_LENGTH:
        return conn.execute(text, params)
    statement = sql.positional(text)
    cursor: RawCursor[tuple[Any, ...]] = RawCursor(conn)
    return cursor.execute(statement.text, statement.values(params))


class _FairWalk:
    """Where this store's tenant-fair claims resume their walk of the tenants, and the weights.

    The walk goes in tenant order from the tenant after the last one served, and around. The
    last one served is the tenant of the claim's last due row (takeovers are not part of the
    walk), so that the rows one claim cannot share evenly go to the next tenants next time. A
    claim that served one tenant only (a claim of one row, or one tenant with work) counts that
    tenant's rows: the walk stays on it until it has had its weight's worth, so that weights
    hold for small claims too. Claimers of one store share it, under a lock.
    """

    def __init__(self, weights: dict[str, int]) -> None:
        self._weights = weights
        self._json = Jsonb(weights) if weights else None
        self._lock = threading.Lock()
        #: the walk starts after this tenant
        self._after = ""
        #: rows served in a row to the tenant the walk keeps returning to, and which it is
        self._staying: tuple[str, int] | None = None

    def params(self) -> dict[str, Any]:
        with self._lock:
            return {"after": self._after, "weights": self._json}

    def served(self, after: str, claims: Sequence[Claim]) -> None:
        rows = Counter(c.tenant_id for c in claims if not c.takeover)
        if not rows:
            return
        # The tenant of the claim's last row: the claim ranks a tenant's rows by their number
        # over its weight, then the tenants in walk order (after `after`, then around).
        last = max(rows, key=lambda t: (rows[t] // self._weights.get(t, 1), t <= after, t))
        with self._lock:
            if after != self._after:
                return  # another claimer moved the walk on meanwhile
            if len(rows) == 1:
                tenant, had = self._staying or ("", 0)
                had = (had if tenant == last else 0) + rows[last]
                if had < self._weights.get(last, 1):
                    self._staying = (last, had)
                    return  # start at this tenant again: its turn is not over
            self._staying = None
            self._after = last


def _only_the_claim_failed(settled: psycopg.Cursor[tuple[Any, ...]] | None, exc: Exception) -> bool:
    """Whether a settle-and-claim failed in its claim alone, as the server reported on a live
    connection (so the transaction certainly rolled back), after its settlement ran."""
    if isinstance(exc, StoreUnavailable) and exc.outcome_unknown:
        return False
    if not isinstance(exc, (StoreUnavailable, StoreError)) or settled is None:
        return False
    result = settled.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def _settled_only(settlements: Sequence[Settlement], method: str) -> None:
    if any(s.state in (State.QUEUED, State.CLAIMED) for s in settlements):
        raise ValueError(f"{method} moves rows to a settled state only")


def _settlements_params(
    settlements: Sequence[Settlement], now: datetime | None, history: int
) -> dict[str, Any]:
    return {
        "history": history,
        **_tickets_params([s.ticket for s in settlements]),
        "state": [s.state.value for s in settlements],
        "outcome_code": [s.outcome_code for s in settlements],
        "outcome_detail": [s.outcome_detail for s in settlements],
        "error_class": [s.error_class for s in settlements],
        "finding": [s.finding for s in settlements],
        "now": now,
    }


def _stale(tickets: Sequence[Ticket], moved: Sequence[tuple[Any, ...]]) -> list[Ticket]:
    """The tickets no returned ``(tenant_id, operation_id, fence)`` row vouches for: their fence
    was no longer current, so the batch statement left their rows alone."""
    current = {(t, o, int(f)) for t, o, f in moved}
    return [t for t in tickets if (t.tenant_id, t.operation_id, t.fence) not in current]


def _existing(conn: Connection, keys: Sequence[Key]) -> dict[Key, tuple[bytes, State]]:
    """The stored payload hash and state of operations an ingest did not insert."""
    if not keys:
        return {}
    rows = conn.execute(sql.statement("ingest_existing"), _keys_params(keys)).fetchall()
    stored = {Key(t, o): (bytes(h), State(s)) for t, o, h, s in rows}
    missing = [k for k in keys if k not in stored]
    if missing:
        # Neither inserted nor visible: the row was deleted between the two statements
        # (purge or erasure). Nothing can be decided; the batch is not acknowledged.
        raise StoreUnavailable(
            f"ingest: {len(missing)} existing operation(s) vanished mid-batch; retry"
        )
    return stored


def _firsts(batch: Sequence[Delivery | Rejection]) -> dict[Key, Delivery]:
    """The first delivery of each operation in the batch, in delivery order."""
    firsts: dict[Key, Delivery] = {}
    for item in batch:
        if isinstance(item, Delivery):
            firsts.setdefault(item.key, item)
    return firsts


def insert_params(
    fresh: Sequence[Delivery], refs: Sequence[str], leases: Sequence[float | None] | None = None
) -> dict[str, Any]:
    """ingest_insert.sql's batch: one JSON array of each delivery's columns, in the order the
    statement reads them (the last, a lease in seconds for a row to write claimed), and the
    bodies beside it as one binary array."""
    taken = leases if leases is not None else [None] * len(fresh)
    rows = json.dumps(
        [
            [
                d.tenant_id,
                d.operation_id,
                d.subscription,
                d.job_type,
                d.target_class.value,
                d.schema_version,
                d.payload_hash.hex(),
                ref,
                d.max_attempts,
                d.ordering_key,
                d.broker_message_id,
                d.receive_count,
                d.trace_context,
                d.priority,
                lease,
            ]
            for d, ref, lease in zip(fresh, refs, taken, strict=True)
        ]
    )
    return {"rows": rows, "body": [d.payload for d in fresh]}


def _new(key: Key, claim: Claim | None) -> IngestResult:
    """A new operation's result: queued, or written claimed for the pool that asked."""
    if claim is None:
        return IngestResult(Decision.NEW, key, State.QUEUED)
    return IngestResult(Decision.NEW, key, State.CLAIMED, claim=claim)


def _written_claimed(
    firsts: dict[Key, Delivery], rows: Sequence[tuple[Any, ...]]
) -> dict[Key, Claim]:
    """The claims of the rows an insert wrote claimed (a lease returned), made from their
    deliveries: the first claim of a new row, fence 1, attempt 1, no intent, no takeover."""
    claims: dict[Key, Claim] = {}
    for tenant_id, operation_id, lease_expires_at, identity_key_id, *_ in rows:
        if lease_expires_at is None:
            continue
        key = Key(tenant_id, operation_id)
        d = firsts[key]
        claims[key] = Claim(
            tenant_id=tenant_id,
            operation_id=operation_id,
            fence=1,
            attempts=1,
            max_attempts=d.max_attempts,
            subscription=d.subscription,
            job_type=d.job_type,
            target_class=d.target_class,
            schema_version=d.schema_version,
            payload=d.payload,
            payload_hash=d.payload_hash,
            lease_expires_at=lease_expires_at,
            intent_fence=None,
            takeover=False,
            trace_context=d.trace_context,
            broker_message_id=d.broker_message_id,
            receive_count=d.receive_count,
            ordering_key=d.ordering_key,
            identity_key_id=int(identity_key_id),
        )
    return claims


def _rejection_key(item: Rejection) -> Key | None:
    if item.tenant_id and item.operation_id:
        return Key(item.tenant_id, item.operation_id)
    return None


def _shadow_params(
    batch: Sequence[Delivery | Rejection], results: Sequence[IngestResult], now: datetime | None
) -> dict[str, Any]:
    cols: dict[str, list[Any]] = {
        name: []
        for name in (
            "subscription",
            "decision",
            "tenant_id",
            "operation_id",
            "job_type",
            "payload_hash",
            "reason",
            "broker_message_id",
        )
    }
    for item, result in zip(batch, results, strict=True):
        row: tuple[Any, ...]
        if isinstance(item, Rejection):
            row = (
                item.subscription,
                result.decision.value,
                item.tenant_id,
                item.operation_id,
                item.job_type,
                None,
                item.reason,
                item.broker_message_id,
            )
        else:
            row = (
                item.subscription,
                result.decision.value,
                item.tenant_id,
                item.operation_id,
                item.job_type,
                item.payload_hash,
                None,
                item.broker_message_id,
            )
        for name, value in zip(cols, row, strict=True):
            cols[name].append(value)
    return {**cols, "now": now}


def _refuse_if_keys_missed(exc: psycopg.DatabaseError) -> None:
    """An inbox write the database refused because an erasure hashed its tombstones under
    none of this process's identity keys (migration 0024) raises what the operator must do."""
    if exc.sqlstate == KEYS_MISSED:
        hint = exc.diag.message_hint
        raise IdentityKeysOutdated(
            f"ingest: {exc.diag.message_primary}" + (f"; {hint}" if hint else "")
        ) from exc


@dataclass(frozen=True, slots=True)
class _Tombstone:
    """What an erased operation left (migration 0014), as the inbox compares with it."""

    payload_hash: bytes
    state: State
    tenant_hash: str
    operation_hash: str


@dataclass(frozen=True, slots=True)
class _ErasedConflict:
    """A delivery whose payload differs from its erased operation's: recorded by hashes."""

    delivery: Delivery
    tombstone: _Tombstone


def _reject_params(items: Sequence[Rejection | Delivery | _ErasedConflict]) -> dict[str, Any]:
    cols: dict[str, list[Any]] = {
        name: []
        for name in (
            "kind",
            "reason",
            "subscription",
            "broker_message_id",
            "tenant_id",
            "operation_id",
            "job_type",
            "payload_hash",
            "payload_ref",
            "body",
        )
    }
    for item in items:
        row: tuple[Any, ...]
        if isinstance(item, _ErasedConflict):
            d, t = item.delivery, item.tombstone
            row = (
                "conflict",
                f"{ERASED_CONFLICT_REASON} (tenant {t.tenant_hash}, erased operation "
                f"{t.operation_hash[:16]}, state {t.state.value})",
                d.subscription,
                d.broker_message_id,
                None,  # the erasure removed the identifiers; the hashes above name it
                None,
                d.job_type,
                d.payload_hash,
                None,
                None,
            )
        elif isinstance(item, Delivery):
            row = (
                "conflict",
                CONFLICT_REASON,
                item.subscription,
                item.broker_message_id,
                item.tenant_id,
                item.operation_id,
                item.job_type,
                item.payload_hash,
                None,
                None,  # a conflicting payload is not kept: only its hash, as evidence
            )
        else:
            row = (
                "quarantined",
                item.reason,
                item.subscription,
                item.broker_message_id,
                item.tenant_id,
                item.operation_id,
                item.job_type,
                None,
                f"pg:{uuid.uuid4().hex}",
                item.body,
            )
        for name, value in zip(cols, row, strict=True):
            cols[name].append(value)
    return cols


def _claim(row: tuple[Any, ...]) -> Claim:
    (
        tenant_id,
        operation_id,
        fence,
        attempts,
        max_attempts,
        subscription,
        job_type,
        target_class,
        schema_version,
        payload_hash,
        lease_expires_at,
        intent_fence,
        takeover,
        trace_context,
        broker_message_id,
        receive_count,
        ordering_key,
        payload,
        identity_key_id,
    ) = row
    return Claim(
        tenant_id=tenant_id,
        operation_id=operation_id,
        fence=fence,
        attempts=attempts,
        max_attempts=max_attempts,
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        schema_version=schema_version,
        payload=bytes(payload) if payload is not None else None,
        payload_hash=bytes(payload_hash),
        lease_expires_at=lease_expires_at,
        intent_fence=intent_fence,
        takeover=takeover,
        trace_context=trace_context,
        broker_message_id=broker_message_id,
        receive_count=receive_count,
        ordering_key=ordering_key,
        identity_key_id=int(identity_key_id),
    )


def _row_summary(row: tuple[Any, ...]) -> RowSummary:
    (seq, tenant_id, operation_id, subscription, job_type, target_class, state, fence,
     attempts, max_attempts, outcome_code, created_at, claimed_at, settled_at, lease_expires_at,
    ) = row  # fmt: skip
    return RowSummary(
        seq=int(seq),
        key=Key(tenant_id, operation_id),
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass(target_class),
        state=State(state),
        fence=int(fence),
        attempts=int(attempts),
        max_attempts=int(max_attempts),
        outcome_code=outcome_code,
        created_at=created_at,
        claimed_at=claimed_at,
        settled_at=settled_at,
        lease_expires_at=lease_expires_at,
    )


def _rejected_summary(row: tuple[Any, ...]) -> RejectedSummary:
    (rejected_id, kind, reason, subscription, tenant_id, operation_id, created_at, redriven_at,
     redriven_by, redrive_outcome, resolved_at, resolved_by,
    ) = row  # fmt: skip
    known = tenant_id is not None and operation_id is not None
    return RejectedSummary(
        id=int(rejected_id),
        kind=kind,
        reason=reason,
        subscription=subscription,
        key=Key(tenant_id, operation_id) if known else None,
        created_at=created_at,
        redriven_at=redriven_at,
        redriven_by=redriven_by,
        redrive_outcome=redrive_outcome,
        resolved_at=resolved_at,
        resolved_by=resolved_by,
    )
