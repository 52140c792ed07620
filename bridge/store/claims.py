"""The claims' table family: the claim statements and the policy they carry.

A claim is one statement: it locks claimable rows with ``FOR UPDATE SKIP LOCKED``, adds one to
each row's ``fence`` and ``attempts``, and sets the lease from the database clock; every write
made for the claim afterwards is fenced (:mod:`bridge.store.settle`). Which rows a claim may
take is its :class:`ClaimPolicy`: concurrency limits and token rates (counted by the limited
claim statements, in the database) and tenant fairness (claims walk the tenants in turn). The
policy is given when the store opens, for the process's life: every process claiming a job type
must carry the same limits and rates, and nothing that holds a store can change how its other
threads claim.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import RawCursor, pq
from psycopg.types.json import Jsonb

from bridge import sql
from bridge.database import Connection
from bridge.errors import StoreError, StoreUnavailable
from bridge.store.arrays import TextArray
from bridge.store.db import Database, claim_from_row, keys_params
from bridge.store.settle import SettleStore, settled_only, settlements_params, stale
from bridge.store.work import (
    ConcurrencyLimit,
    SettledClaim,
    Settlement,
    TokenRate,
)
from bridge.types import Claim, Key


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimPolicy:
    """How this process's claims choose rows: fixed when the store opens.

    ``concurrency``: job types claimed only within their concurrency limits; ``rates``: job
    types claimed only within their token rates (every run a claim starts, a takeover too,
    spends a token of its job type's bucket and of its (job type, tenant)'s, kept in the
    database, migration 0018); ``fairness``: claim tenants in turn, each taking its share of a
    claim by its weight (1 unless given), or None to claim in the order rows became due.
    Concurrency-limited claims keep the order rows became due.
    """

    concurrency: Mapping[str, ConcurrencyLimit] = field(default_factory=dict)
    rates: Mapping[str, TokenRate] = field(default_factory=dict)
    fairness: Mapping[str, int] | None = None

    def limited_concurrency(self) -> dict[str, ConcurrencyLimit]:
        return {job: limit for job, limit in self.concurrency.items() if limit.limited}

    def limited_rates(self) -> dict[str, TokenRate]:
        return {job: rate for job, rate in self.rates.items() if rate.limited}

    def holds_back(self, job_type: str) -> bool:
        """Whether a claim of ``job_type`` is counted against a limit or a rate (so that only a
        claim statement may take one of its rows)."""
        limit, rate = self.concurrency.get(job_type), self.rates.get(job_type)
        return bool((limit is not None and limit.limited) or (rate is not None and rate.limited))


class ClaimStore:
    """The claims of one process, under its :class:`ClaimPolicy`. Claimers of one store share
    the tenant-fair walk, under a lock."""

    def __init__(self, db: Database, policy: ClaimPolicy, settle: SettleStore) -> None:
        self._db = db
        self._settle = settle
        self.policy = policy
        #: the limited job types, read by the claims
        self._concurrency = policy.limited_concurrency()
        self._rates = policy.limited_rates()
        #: claims take tenants in turn (claim_fair.sql), or None
        self._fair = _FairWalk(dict(policy.fairness)) if policy.fairness is not None else None

    def concurrency_limited(self, job_type: str) -> bool:
        """Whether claims of ``job_type`` wait for a slot under a concurrency limit."""
        return job_type in self._concurrency

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
        with self._db.connection("claim") as conn:
            rows = _execute(conn, text, params).fetchall()
        return self._claimed(rows, after)

    def claim_keys(self, worker: str, keys: Sequence[Key], lease: timedelta) -> list[Claim]:
        """Claim exactly these rows where they are claimable (hand-off after ingest)."""
        if not keys:
            return []
        text, params, after = self._claim_request(worker, lease, 0, keys, None)
        with self._db.connection("claim") as conn:
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
        """Settle, then claim, in one round trip and one transaction: the claim sees the rows
        the settlements freed (the next row of an ordered group, a slot under a limit), and
        each row still moves only under its own fence, inside its statement. A claim the server
        refuses rolls the whole transaction back before it commits, so the settlements are then
        written alone; a broken connection leaves the outcome unknown and raises, as a failed
        settlement does."""
        settled_only(settlements, "settle_and_claim")
        if not settlements:
            if keys:
                return SettledClaim([], self.claim_keys(worker, keys, lease))
            return SettledClaim([], self.claim(worker, limit, lease, job_types=job_types))
        if not keys and limit < 1:
            return SettledClaim(self._settle.settle_many(settlements), [])
        text, params, after = self._claim_request(worker, lease, limit, keys, job_types)
        settled: psycopg.Cursor[tuple[Any, ...]] | None = None
        try:
            with self._db.connection("settle and claim") as conn:
                # One pipeline, one Sync: the two statements go out in one round trip and run
                # as one implicit transaction, which the Sync commits, or rolls back whole
                # once either fails (no BEGIN, no COMMIT, no round trip of their own).
                with conn.pipeline():
                    settled = conn.execute(
                        sql.statement("settle_many"),
                        settlements_params(settlements, self._db.now(), self._db.attempt_history),
                    )
                    claimed = _execute(conn, text, params)
                moved = settled.fetchall()
                rows = claimed.fetchall()
        except Exception as exc:
            if not _only_the_claim_failed(settled, exc):
                raise  # the settlement failed, or the outcome is unknown: the batch's error
            # The server refused the claim on a live connection: nothing of the transaction
            # committed, the settlements included; they are written alone.
            return SettledClaim(self._settle.settle_many(settlements), [], exc)
        return SettledClaim(
            stale([s.ticket for s in settlements], moved), self._claimed(rows, after)
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
            "identity_keys": self._db.identity_keys,
            "history": self._db.attempt_history,
            "now": self._db.now(),
        }
        if keys:
            limits = self._limits(None)
            text = (
                sql.with_limit("claim_keys", len(keys))
                if limits is None
                else sql.statement("claim_keys_limited")
            )
            return text, {**common, **keys_params(keys), **_limit_params(limits)}, None
        limits = self._limits(job_types)
        text, extra = self._claim_statement(limits, limit)
        params = {
            **common,
            "limit": limit,
            "job_types": TextArray(job_types) if job_types is not None else None,
            **_limit_params(limits),
            **extra,
        }
        return text, params, extra.get("after")

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

    def _claimed(self, rows: Sequence[tuple[Any, ...]], after: str | None) -> list[Claim]:
        claims = [claim_from_row(r) for r in rows]
        if self._fair is not None and after is not None:
            self._fair.served(after, claims)
        return claims


@dataclass(frozen=True, slots=True)
class _Limits:
    """A limited claim's ``%(slots)s`` and ``%(rates)s`` (None where it has none)."""

    slots: Jsonb | None
    rates: Jsonb | None


def _limit_params(limits: _Limits | None) -> dict[str, Any]:
    if limits is None:
        return {"slots": None, "rates": None}
    return {"slots": limits.slots, "rates": limits.rates}


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
