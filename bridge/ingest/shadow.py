"""The inbox store of a shadow subscription (``mode = "shadow"``): a copy of the stream is
decided as the inbox decides it and recorded apart from the work rows, where no claim reads it.
The comparison with the existing system's effect log is the operators'
(:mod:`bridge.operator.shadow`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.types import Delivery, IngestResult, InsertClaim, Rejection

if TYPE_CHECKING:
    from bridge.store.ingest import IngestStore
    from bridge.store.work import QuotaDeferred


class ShadowWrites:
    """The inbox store of a shadow subscription: every batch goes to the shadow record.

    A shadow copy is never deferred by the tenant backlog quota (the quota guards live work),
    and nothing is handed to the worker pool.
    """

    def __init__(self, store: IngestStore) -> None:
        self._store = store

    def ingest(
        self, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None = None
    ) -> list[IngestResult]:
        _unclaimed(claim)
        return self._store.ingest_shadow(batch)

    def ingest_within_quota(
        self, batch: Sequence[Delivery | Rejection], quota: int, claim: InsertClaim | None = None
    ) -> list[IngestResult | QuotaDeferred]:
        _unclaimed(claim)
        return list(self._store.ingest_shadow(batch))


def _unclaimed(claim: InsertClaim | None) -> None:
    """A shadow record is never run: a pool asking to claim from it is a wiring error."""
    if claim is not None:
        raise TypeError("a shadow subscription's deliveries are never claimed")
