"""The inbox's table family: received batches written as work, replays, conflicts and
rejections; a quota's check; a shadow subscription's record; the watch of held deliveries.

A batch is written in one transaction (most often one statement): after :meth:`IngestStore.ingest`
returns, every delivery of it is held by the database and may be acknowledged. New keys become
queued work rows (or, for the pool that asked, rows written claimed); a key that exists with the
same payload hash is a replay; with another hash it is a conflict (nothing is mutated, the
delivery is recorded as rejected). An operation an erasure removed is found by its tombstone, a
keyed hash under every identity key held.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg

from bridge import sql
from bridge.database import Connection
from bridge.errors import ConfigError, IdentityKeysOutdated, StoreUnavailable
from bridge.store.claims import ClaimPolicy
from bridge.store.db import KEYS_MISSED, Database, keys_params
from bridge.store.evidence import record_replays
from bridge.store.work import QuotaDeferred
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    Rejection,
    State,
)

#: the SQLSTATE of a refused one-round-trip write (migrations 0022, 0023): a key of the batch
#: could not be decided in its snapshot, or has a tombstone
NOT_NEW = "FBNEW"
CONFLICT_REASON = "payload hash differs from the operation's approved payload"
#: a conflict with a tombstone: recorded without the raw identifiers the erasure removed
ERASED_CONFLICT_REASON = "payload hash differs from the erased operation's payload"


class IngestStore:
    """The inbox's writes, under the claim policy a written-claimed row must respect."""

    def __init__(self, db: Database, policy: ClaimPolicy) -> None:
        self._db = db
        self._policy = policy

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
        with self._db.connection("ingest") as conn:
            if firsts and all(isinstance(item, Delivery) for item in batch):
                written = self._ingest_batch(conn, batch, firsts, claim)
                if written is not None:
                    return written
            with conn.transaction():
                return self._ingest(conn, batch, claim)

    def _ingest_batch(
        self,
        conn: Connection,
        batch: Sequence[Delivery | Rejection],
        firsts: dict[Key, Delivery],
        claim: InsertClaim | None,
    ) -> list[IngestResult] | None:
        """Write a batch of deliveries in one statement, its own transaction (ingest_batch.sql:
        the insert of the new keys, the replays and conflicts of the keys that existed recorded
        as the careful way records them, and its check that every key was decided in the
        statement's snapshot and none has a tombstone); one result per delivery. None when the
        check refused: the statement failed, nothing of it committed, and the batch goes the
        careful way, in a transaction of its own (a key another writer inserted and committed
        while this statement ran, a tombstone).

        The careful way costs three round trips (BEGIN, the insert with its tombstone lookup,
        COMMIT) and two or three more for a batch that holds a key that existed (its lookup,
        the replays' record, the conflicts'), each a wake-up of this thread and of the server's
        process. One statement is one round trip, and costs the client less than the insert
        and a separate check sent in one pipeline did (measured: docs/benchmarks.md, "Inbox to
        settle, end to end"). Brokers redeliver: at 10% of deliveries re-sent, about two
        batches of 10 in three hold one, and went the careful way before. No BEGIN and no
        ROLLBACK: psycopg forgets every prepared statement of a connection at a ROLLBACK, and a
        refusal would cost the next statements their plans.
        """
        params = {
            **self._insert_params(list(firsts.values()), claim),
            **self._tombstone_hashes(list(firsts)),
            "expected": len(firsts),
            "copies": _copies(batch, firsts) if len(firsts) < len(batch) else None,
            "conflict": CONFLICT_REASON,
        }
        try:
            rows = conn.execute(sql.statement("ingest_batch"), params).fetchall()
        except psycopg.DatabaseError as exc:
            if exc.sqlstate == NOT_NEW:
                return None
            _refuse_if_keys_missed(exc)
            raise
        claims = _written_claimed(firsts, rows)
        stored = {Key(t, o): (bytes(h), State(s)) for t, o, *_, h, s in rows if s is not None}
        if not stored and len(firsts) == len(batch):
            # Every delivery a new operation (the common batch): nothing else to decide.
            return [_new(key, claims.get(key)) for key in firsts]
        inserted = {key for key in firsts if key not in stored}
        for key in inserted:
            stored[key] = (
                firsts[key].payload_hash,
                State.CLAIMED if key in claims else State.QUEUED,
            )
        results, _, _ = _decide(batch, firsts, inserted, claims, stored, {})
        return results

    def _tombstone_hashes(self, keys: Sequence[Key]) -> dict[str, Any]:
        """ingest_batch.sql's tombstone lookup: the keyed hashes of ``keys`` under every
        identity key held, or, with none to hash by, a lookup of any tombstone at all."""
        hashed = self._hashed(keys)
        return {
            "key_id": [key_id for _, key_id, _ in hashed],
            "operation_hash": [digest for _, _, digest in hashed],
            "any_erased": self._db.erased_hashes is None,
        }

    def _hashed(self, keys: Sequence[Key]) -> list[tuple[Key, int, bytes]]:
        """Each key with its keyed hash under every identity key held (none without them)."""
        derive = self._db.erased_hashes
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
        """ingest_insert.sql's (and ingest_batch.sql's) parameters for new operations, each
        with a payload reference drawn for this write and, for ``claim``, its lease where it
        may be written claimed."""
        # One random draw per batch, not per delivery (each is a system call): the batch's
        # token and the delivery's place in it are unique together.
        batch = secrets.token_hex(16)
        refs = [f"pg:{batch}-{i}" for i in range(len(fresh))]
        return {
            **insert_params(fresh, refs, self._insert_leases(fresh, claim)),
            "worker": claim.worker if claim is not None else None,
            "identity_key_id": self._db.identity_key,
            "aging": self._db.aging,
            "now": self._db.now(),
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
        held = self._db.identity_keys
        if held is not None and self._db.identity_key not in held:
            return None
        left = claim.limit
        leases: list[float | None] = []
        for d in fresh:
            lease = claim.leases.get(d.job_type)
            if (
                left
                and lease is not None
                and d.ordering_key is None
                and not self._policy.holds_back(d.job_type)
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
        results, rejected, replays = _decide(batch, firsts, inserted, claims, stored, erased)
        if rejected:
            conn.execute(sql.statement("reject"), _reject_params(rejected))
        record_replays(conn, replays, self._db.now())
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
        inserted = {Key(t, o) for t, o, *_ in rows}
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
        now = self._db.now()
        with self._db.connection("shadow ingest") as conn, conn.transaction():
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
                    {**keys_params(others), "subscription": subscription},
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
        if self._db.erased_hashes is None:
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
        if self._db.erased_hashes is None:
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
            conn.execute(sql.statement("ingest_erased_undo"), keys_params(list(found)))
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
        with self._db.connection("ingest") as conn, conn.transaction():
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
                    sql.statement("ingest_existing"), keys_params(tight)
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
        with self._db.connection("watch") as conn:
            rows = conn.execute(
                sql.statement("watch"), {**keys_params(keys), "now": self._db.now()}
            ).fetchall()
        return {Key(t, o): (State(s), bool(live)) for t, o, s, live in rows}


def _existing(conn: Connection, keys: Sequence[Key]) -> dict[Key, tuple[bytes, State]]:
    """The stored payload hash and state of operations an ingest did not insert."""
    if not keys:
        return {}
    rows = conn.execute(sql.statement("ingest_existing"), keys_params(keys)).fetchall()
    stored = {Key(t, o): (bytes(h), State(s)) for t, o, h, s in rows}
    missing = [k for k in keys if k not in stored]
    if missing:
        # Neither inserted nor visible: the row was deleted between the two statements
        # (purge or erasure). Nothing can be decided; the batch is not acknowledged.
        raise StoreUnavailable(
            f"ingest: {len(missing)} existing operation(s) vanished mid-batch; retry"
        )
    return stored


def _decide(  # noqa: PLR0917  (the decision's inputs, as both ways gather them)
    batch: Sequence[Delivery | Rejection],
    firsts: dict[Key, Delivery],
    inserted: set[Key],
    claims: dict[Key, Claim],
    stored: dict[Key, tuple[bytes, State]],
    erased: dict[Key, _Tombstone],
) -> tuple[list[IngestResult], list[Rejection | Delivery | _ErasedConflict], list[Key]]:
    """Each delivery's result, in order: the first of a key ``inserted`` new, one with the
    ``stored`` payload hash (the row's, or the first's of a row just inserted) a replay, one
    with another a conflict, one of an ``erased`` key decided against its tombstone; and what
    to record: the rejected (conflicts, undecodable input) and the replays (a key once per
    replayed copy). ingest_batch.sql decides and records the same in its statement."""
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
    return results, rejected, replays


def _copies(batch: Sequence[Delivery | Rejection], firsts: dict[Key, Delivery]) -> str:
    """ingest_batch.sql's later deliveries of a key the batch holds already: each as the place
    of its key's first in the batch's rows (1-based), its payload hash in hex, subscription,
    broker message id and job type, one JSON array."""
    place = {key: i for i, key in enumerate(firsts, 1)}
    return json.dumps(
        [
            [
                place[d.key],
                d.payload_hash.hex(),
                d.subscription,
                d.broker_message_id,
                d.job_type,
            ]
            for d in batch
            if isinstance(d, Delivery) and d is not firsts[d.key]
        ]
    )


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
    deliveries: the first claim of a new row, fence 1 of the fence's epoch (as written),
    attempt 1, no intent, no takeover."""
    claims: dict[Key, Claim] = {}
    for tenant_id, operation_id, lease_expires_at, identity_key_id, fence, *_ in rows:
        if lease_expires_at is None:
            continue
        key = Key(tenant_id, operation_id)
        d = firsts[key]
        claims[key] = Claim(
            tenant_id=tenant_id,
            operation_id=operation_id,
            fence=fence,
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
