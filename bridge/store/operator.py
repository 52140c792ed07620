"""The operators' table family: histories, parked work and the moves a person makes.

The operator verbs (:mod:`bridge.operator`), the commands and the console call
:class:`OperatorQueries`. Every move here is guarded inside its statement and audited; a dry run
executes the same statement and rolls it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bridge import sql
from bridge.errors import ConfigError, ErasureRefused
from bridge.store.claims import ClaimPolicy
from bridge.store.db import KEYS_MISSED, Database
from bridge.store.evidence import DeliveryEvidence, evidence_of
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
    WorkRecord,
)
from bridge.store.work import (
    TOMBSTONE_DAYS_DEFAULT,
    ConcurrencyLimit,
    TokenRate,
    WaitingCount,
)
from bridge.types import (
    Decision,
    Key,
    RedriveFilter,
    Redriven,
    State,
    StateCount,
    Stats,
    TargetClass,
)

#: an erasure refused, nothing erased: rows or messages in scope not settled (object_in_use),
#: rows written after their hashes were computed (serialization_failure), the current key not
#: held
ERASURE_REFUSALS = frozenset({"55006", "40001", KEYS_MISSED})


class OperatorQueries:
    """What a person reads and moves: every move guarded in its statement and audited."""

    def __init__(self, db: Database, policy: ClaimPolicy) -> None:
        self._db = db
        #: the claim policy the store opened with: what :meth:`waiting` counts by default
        self._policy = policy

    def stats(self) -> Stats:
        """Counts by subscription, tenant and state; stalled claims; the oldest unknown."""
        return self._stats("stats_counts")

    def open_stats(self) -> Stats:
        """:meth:`stats` with the counts of open and parked rows only (never the succeeded or
        failed history): what the database gauges read at every refresh."""
        return self._stats("stats_open")

    def _stats(self, counting: str) -> Stats:
        with self._db.connection("stats") as conn:
            counts = conn.execute(sql.statement(counting)).fetchall()
            health = conn.execute(sql.statement("stats_health"), {"now": self._db.now()}).fetchone()
        assert health is not None
        stalled, oldest, conflicts, quarantined = health
        return Stats(
            counts=tuple(StateCount(sub, t, State(s), int(n)) for sub, t, s, n in counts),
            stalled_claims=int(stalled),
            oldest_unknown_seconds=float(oldest) if oldest is not None else None,
            rejected={"conflict": int(conflicts), "quarantined": int(quarantined)},
        )

    def waiting(
        self,
        limits: Mapping[str, ConcurrencyLimit] | None = None,
        rates: Mapping[str, TokenRate] | None = None,
    ) -> list[WaitingCount]:
        """Queued rows that are due and yet not claimable, per job type, tenant and reason:
        ``rate`` (a rate limit wait, or no whole token in a bucket of ``rates``) or ``limit``
        (over a concurrency limit of ``limits``); the store's own claim policy's where not
        given. A row waiting for
        both counts as ``rate``."""
        given = self._policy.concurrency if limits is None else limits
        slots = {
            job: [limit.total, limit.per_tenant] for job, limit in given.items() if limit.limited
        }
        rated = self._policy.rates if rates is None else rates
        buckets = {job: rate.buckets() for job, rate in rated.items() if rate.limited}
        with self._db.connection("waiting") as conn:
            rows = conn.execute(
                sql.statement("waiting"),
                {
                    "slots": Jsonb(slots) if slots else None,
                    "rates": Jsonb(buckets) if buckets else None,
                    "now": self._db.now(),
                },
            ).fetchall()
        return [WaitingCount(job, tenant, reason, int(n)) for job, tenant, reason, n in rows]

    def history(self, key: Key) -> OperationHistory:
        """The work row, its attempts, its redrives and its rejected deliveries, in one
        read-only snapshot."""
        params = {"tenant_id": key.tenant_id, "operation_id": key.operation_id}
        with self._db.connection("inspect") as conn, conn.transaction():
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

    def evidence(self, key: Key) -> DeliveryEvidence:
        """How many copies of the operation's delivery arrived, and when (migration 0030)."""
        return evidence_of(self._db, key)

    def erasures(self, tenant_hash: str, operation_hash: str | None = None) -> list[ErasureRecord]:
        """The recorded erasures of the tenant with this keyed hash (and of the operation with
        this one), newest first."""
        with self._db.connection("inspect") as conn:
            rows = conn.execute(
                sql.statement("inspect_erasures"),
                {"tenant_hash": tenant_hash, "operation_hash": operation_hash},
            ).fetchall()
        return [ErasureRecord(at, actor, reason, bool(one)) for at, actor, reason, one in rows]

    def parked(self, selection: RedriveFilter) -> list[ParkedRow]:
        """The parked rows a redrive with this selection would consider, oldest first."""
        with self._db.connection("redrive") as conn:
            rows = conn.execute(
                sql.statement("redrive_candidates"), _selection_params(selection)
            ).fetchall()
        return [_parked_row(r) for r in rows]

    def quarantined_deliveries(self, selection: RedriveFilter) -> list[QuarantinedDelivery]:
        """Quarantined deliveries not yet redriven that match the selection, oldest first."""
        with self._db.connection("redrive") as conn:
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
            "now": self._db.now(),
            "aging": self._db.aging,
        }
        with self._db.connection("redrive") as conn, conn.transaction(force_rollback=dry_run):
            rows = conn.execute(sql.statement("redrive"), params).fetchall()
        return [Redriven(Key(t, o), State(s), int(f), int(a)) for t, o, s, f, a in rows]

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
        return self._db.guarded_write("redrive_applied", params, dry_run=dry_run)

    def rate_waits(self, job_type: str | None = None) -> list[RateWait]:
        """The targets' rate limit waits still ahead (of one job type), latest end first."""
        with self._db.connection("rate waits") as conn:
            rows = conn.execute(
                sql.statement("rate_waits"), {"job_type": job_type, "now": self._db.now()}
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
            "now": self._db.now(),
            "aging": self._db.aging,
        }
        with self._db.connection("rate waits") as conn, conn.transaction(force_rollback=dry_run):
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
        return self._db.guarded_write("redrive_unfenced", params, dry_run=dry_run)

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
        return self._db.guarded_write("rejected_redriven", params, dry_run=dry_run)

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
            "now": self._db.now(),
        }
        with self._db.connection("resolve") as conn, conn.transaction(force_rollback=dry_run):
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
        with self._db.connection("resolve") as conn:
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
        params = {"older_than": older_than, "limit": limit, "now": self._db.now()}
        with self._db.connection("purge") as conn, conn.transaction():
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
        params = {"older_than": older_than, "now": self._db.now()}
        with self._db.connection("purge") as conn:
            row = conn.execute(sql.statement("purge_count"), params).fetchone()
            gone = conn.execute(
                sql.statement("purge_tombstones_count"),
                {"horizon": tombstone_horizon, "now": self._db.now()},
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
        derive, keys = self._db.erased_hashes, self._db.identity_keys
        if derive is None or not keys:
            raise ConfigError(
                "erase: the identity keys are not bound (bridge.keyring.attach): tombstones "
                "are keyed hashes"
            )
        scope = {"tenant_id": tenant_id, "operation_id": operation_id}
        with self._db.connection("erase") as conn, conn.transaction(force_rollback=dry_run):
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


def _parked_params(row: ParkedRow) -> dict[str, Any]:
    """The parked row's key and the fence the operator's decision was made under."""
    return {
        "tenant_id": row.key.tenant_id,
        "operation_id": row.key.operation_id,
        "fence": row.fence,
    }
