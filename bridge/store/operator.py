"""The work store as an operator sees it: histories, parked work and the moves a person makes.

The operator commands (:mod:`bridge.commands`) and :mod:`bridge.operator` depend on
:class:`OperatorStore`. It shares with the runtime only what both need: writing a batch (a
redrive re-decodes a quarantined delivery into the inbox), the counts and the sweep. Every move
here is guarded inside its statement and audited; a dry run executes the same statement and
rolls it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Protocol

from bridge.store.records import (
    ErasureCounts,
    ErasureRecord,
    LiftedWait,
    OperationHistory,
    ParkedRow,
    PurgeCounts,
    QuarantinedDelivery,
    RateWait,
    RejectedStatus,
    ResolvedDelivery,
)
from bridge.store.work import (
    SWEEP_LIMIT_DEFAULT,
    ConcurrencyLimit,
    KeyedStore,
    Swept,
    TokenRate,
    WaitingCount,
)
from bridge.types import (
    Decision,
    Delivery,
    IngestResult,
    Key,
    RedriveFilter,
    Redriven,
    Rejection,
    Stats,
)


class OperatorStore(KeyedStore, Protocol):
    """**Protocol**: the store the operator commands depend on."""

    def ingest(self, batch: Sequence[Delivery | Rejection]) -> list[IngestResult]:
        """Write one batch in one transaction, as the inbox does (a redrive's re-decoding)."""
        ...

    def stats(self) -> Stats:
        """Counts by subscription, tenant and state; stalled claims; the oldest unknown."""
        ...

    def waiting(
        self,
        limits: Mapping[str, ConcurrencyLimit] | None = None,
        rates: Mapping[str, TokenRate] | None = None,
    ) -> list[WaitingCount]:
        """Due queued rows not claimable now (over a concurrency limit of ``limits``, under a
        rate limit wait, with no whole token left under a rate of ``rates``), per job type,
        tenant and reason: what ``fencebridge status`` shows."""
        ...

    def sweep(self, limit: int = SWEEP_LIMIT_DEFAULT, *, exclusive: bool = False) -> Swept:
        """Park expired claims with no attempt left as ``unknown``, except class D claims that
        never recorded an intent, which go back to the queue; returns what it did."""
        ...

    def history(self, key: Key) -> OperationHistory:
        """The work row, its redrives and its rejected deliveries, in one snapshot."""
        ...

    def erasures(self, tenant_hash: str, operation_hash: str | None = None) -> list[ErasureRecord]:
        """The recorded erasures of the tenant with this keyed hash (and of the operation with
        this one), newest first."""
        ...

    def parked(self, selection: RedriveFilter) -> list[ParkedRow]:
        """The parked rows a redrive with this selection would consider, oldest first."""
        ...

    def quarantined_deliveries(self, selection: RedriveFilter) -> list[QuarantinedDelivery]:
        """Quarantined deliveries not yet redriven that match the selection, oldest first."""
        ...

    def redrive(
        self,
        selection: RedriveFilter,
        *,
        actor: str,
        reason: str,
        extra_attempts: int = 1,
        dry_run: bool = False,
    ) -> list[Redriven]:
        """Send parked rows back to the queue, identity intact, each move audited."""
        ...

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
        """Unknown class C row whose lookup found the effect: succeeded, audited."""
        ...

    def rate_waits(self, job_type: str | None = None) -> list[RateWait]:
        """The targets' rate limit waits still ahead (of one job type), latest end first."""
        ...

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
        queued rows each had scheduled, every such row audited."""
        ...

    def redrive_unfenced(
        self,
        row: ParkedRow,
        *,
        actor: str,
        reason: str,
        extra_attempts: int = 1,
        dry_run: bool = False,
    ) -> bool:
        """Unknown class D row confirmed not called: queued with its intent cleared, audited."""
        ...

    def close_rejected(
        self,
        rejected_id: int,
        *,
        outcome: Decision,
        actor: str,
        reason: str,
        dry_run: bool = False,
    ) -> bool:
        """Mark a quarantined delivery redriven with what the inbox made of it."""
        ...

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
        """Close open rejected deliveries a person has dealt with; work rows are untouched."""
        ...

    def rejected_status(self, ids: Sequence[int]) -> list[RejectedStatus]:
        """Where the named rejected deliveries stand."""
        ...

    def purge_batch(
        self, older_than: timedelta, limit: int, *, tombstone_horizon: timedelta = ...
    ) -> PurgeCounts | None:
        """Remove one bounded batch of finished work, and of tombstones past the horizon;
        None when another purge holds the lock."""
        ...

    def purge_preview(
        self, older_than: timedelta, *, tombstone_horizon: timedelta = ...
    ) -> PurgeCounts:
        """What a purge with this age (and tombstone horizon) would remove right now."""
        ...

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
        """Erase one tenant (or one operation): rows, payloads, rejected deliveries, audit rows
        and sent outbox messages go, one tombstone per operation stays (under every identity
        key held); recorded by hashes. Refuses while a row in scope is queued or claimed, an
        outbox message in scope is pending or (unless ``drop_parked_messages``) parked, or the
        current identity key is not held."""
        ...
