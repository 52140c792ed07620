"""Retention purge: finished work, tombstones, sent outbox messages and shadow records older
than a horizon, deleted in batches."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from bridge.store.records import (
    PurgeCounts,
)
from bridge.store.work import TOMBSTONE_DAYS_DEFAULT

PURGE_BATCH_DEFAULT = 500


class PurgeBatches(Protocol):
    """What the purge loop deletes through: the operators' queries
    (:class:`bridge.store.operator.OperatorQueries`), or a test's scripted batches."""

    def purge_batch(
        self, older_than: timedelta, limit: int, *, tombstone_horizon: timedelta
    ) -> PurgeCounts | None: ...


@dataclass(frozen=True, slots=True)
class PurgeReport:
    removed: PurgeCounts
    batches: int
    #: another purge held the lock: this one stopped (after ``batches`` batches)
    locked_out: bool


def purge(
    store: PurgeBatches,
    older_than: timedelta,
    *,
    batch_size: int = PURGE_BATCH_DEFAULT,
    tombstone_horizon: timedelta = timedelta(days=TOMBSTONE_DAYS_DEFAULT),
) -> PurgeReport:
    """Remove finished work and what shadow subscriptions recorded older than ``older_than``,
    and erased operations' tombstones older than ``tombstone_horizon``, in bounded batches, one
    purger at a time.

    Each batch is its own short transaction holding the purge lock, so a purge never holds
    locks on many rows for long and the bridge keeps running beside it.
    """
    total, batches = PurgeCounts(), 0
    while True:
        removed = store.purge_batch(older_than, batch_size, tombstone_horizon=tombstone_horizon)
        if removed is None:
            return PurgeReport(total, batches, locked_out=True)
        total, batches = total + removed, batches + 1
        limited = (
            removed.work_rows,
            removed.rejected_deliveries,
            removed.tombstones,
            removed.shadow_deliveries,
            removed.shadow_operations,
        )
        if max(limited) < batch_size:  # every kind a batch is limited in has run out
            return PurgeReport(total, batches, locked_out=False)
