"""The inbox: the step every consumer shares between receiving a batch and acknowledging it.

    receive ──▶ decode (pure, never raises) ──▶ one transaction ──▶ COMMIT ──▶ ack
                                                     │
                                                     └─ fails: no ack; the broker redelivers

After :meth:`Inbox.write` returns, the database holds every delivery of the batch: as a new work
row, as a replay of an existing one, as a recorded conflict, or as a quarantined record with its
reason. Only then may the consumer acknowledge. If ``write`` raises, nothing may be
acknowledged: the broker redelivers and the redelivery is a replay or a first write. A crash
between commit and ack costs a replay, never a lost or doubled operation.

New work goes to the local worker pool at once, so a delivery does not wait for the next poll:
as many new rows as the pool has free slots for are written already claimed for it, by the
insert itself (:class:`~bridge.types.InsertClaim`: fence 1, attempt 1, leased from the database
clock, exactly as the targeted claim would lease them a moment later), and go straight to its
workers; the other new keys are handed to it to claim by key.

Under a tenant backlog quota (:meth:`Inbox.admit`), a new operation of a tenant whose open rows
(queued and claimed) are at the quota is not written: it comes back as :class:`Deferred`, and
the consumer must leave it with the broker (no ack), which hands it out again later. One
tenant's flood then waits in the queue, not in the database, while the other tenants of the same
subscription keep flowing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.ingest.decode import undecodable
from bridge.service import Limits, Supervised
from bridge.store.work import QuotaDeferred
from bridge.telemetry import Telemetry
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    InsertClaim,
    Key,
    RawDelivery,
    Rejection,
)

log = logging.getLogger(__name__)

Decoder = Callable[[RawDelivery], Delivery | Rejection]


class InboxStore(Protocol):
    """What the inbox writes through: the work store, or a shadow subscription's record
    (:class:`bridge.operator.shadow.ShadowWrites`)."""

    def ingest(
        self, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None = None
    ) -> list[IngestResult]: ...

    def ingest_within_quota(
        self, batch: Sequence[Delivery | Rejection], quota: int, claim: InsertClaim | None = None
    ) -> list[IngestResult | QuotaDeferred]: ...


class HandOff(Protocol):
    """Where new work goes: the local worker pool (:class:`~bridge.runtime.worker.WorkerPool`)."""

    def reserve(self, job_types: Iterable[str]) -> InsertClaim | None:
        """Slots for a batch's new rows, to write them claimed; None: write them queued."""
        ...

    def accept(self, reserved: InsertClaim, claims: Sequence[Claim], sent_at: float) -> None:
        """The rows written claimed for ``reserved`` (none if the write failed)."""
        ...

    def hand_off(self, items: Iterable[tuple[Key, str]]) -> None:
        """New keys written queued, with their job types: to claim by key."""
        ...


@dataclass(frozen=True, slots=True)
class Written:
    """One delivery of a batch after the inbox transaction committed."""

    raw: RawDelivery
    decoded: Delivery | Rejection
    result: IngestResult

    @property
    def decision(self) -> Decision:
        return self.result.decision

    @property
    def awaits_outcome(self) -> bool:
        """A work row exists whose outcome an ``after_outcome`` consumer waits for (an erased
        operation's replay has none: its outcome is the tombstone's)."""
        return self.result.decision in (Decision.NEW, Decision.REPLAY) and not self.result.erased


@dataclass(frozen=True, slots=True)
class Deferred:
    """One delivery of a batch that was not written (its tenant's backlog is at the quota).

    Nothing of it is in the database: the consumer must not acknowledge it, so the broker
    keeps it and redelivers it once its visibility timeout or ack deadline runs out.
    """

    raw: RawDelivery
    decoded: Delivery
    #: why it waits with the broker (the consumers' counter is ``deferred_<reason>``)
    reason: str = "quota"


class Inbox:
    def __init__(
        self,
        store: InboxStore,
        decoder: Decoder,
        *,
        pool: HandOff | None = None,
        system: str = "unknown",
        telemetry: Telemetry | None = None,
        limits: Limits | None = None,
    ) -> None:
        self._store = store
        self._decoder = decoder
        self._pool = pool
        self._system = system
        self._telemetry = telemetry
        self._limits = limits

    def supervised(self, name: str, body: Callable[[], object], **options: Any) -> Supervised:
        """A consumer's loop as a supervised service of this bridge.

        Its restarts are counted in ``fencebridge.thread.restarts`` and it fails ``/healthz``
        past the bridge's limits, like the core's own loops. ``options`` are
        :class:`~bridge.service.Supervised`'s.
        """
        on_restart = self._telemetry.thread_restarted if self._telemetry is not None else None
        return Supervised(name, body, limits=self._limits, on_restart=on_restart, **options)

    def decode(self, raw: RawDelivery) -> Delivery | Rejection:
        try:
            return self._decoder(raw)
        except Exception as exc:  # noqa: BLE001  (a decoder bug quarantines one delivery)
            # Type only: the error's text may quote the payload or an identifier.
            log.error("decoder raised %s; the delivery is quarantined", type(exc).__name__)
            return undecodable(raw.subscription, raw, exc)

    def write(self, batch: Sequence[RawDelivery]) -> list[Written]:
        """Decode and store a batch in one transaction. Raises if nothing may be acked."""
        outcomes = self.admit(batch, quota=None)
        written = [o for o in outcomes if isinstance(o, Written)]
        assert len(written) == len(outcomes), "nothing is deferred without a quota"
        return written

    def admit(self, batch: Sequence[RawDelivery], *, quota: int | None) -> list[Written | Deferred]:
        """:meth:`write` under a tenant backlog quota (``None``: none), one outcome per delivery
        in order. A :class:`Deferred` delivery must not be acked. Raises if nothing may be."""
        if not batch:
            return []
        tel = self._telemetry
        subscription = batch[0].subscription
        with ExitStack() as spans:
            span = (
                spans.enter_context(tel.receive(self._system, subscription, batch)) if tel else None
            )
            with tel.inbox_write(subscription) if tel else nullcontext():
                decoded = [self.decode(raw) for raw in batch]
                results = self._ingest(decoded, quota)
            outcomes: list[Written | Deferred] = [
                Written(r, d, res)
                if isinstance(res, IngestResult)
                else Deferred(r, _delivery(d), "quota")
                for r, d, res in zip(batch, decoded, results, strict=True)
            ]
            written = [o for o in outcomes if isinstance(o, Written)]
            if tel and span is not None:
                # While the receive span is still open: events on an ended span are dropped.
                tel.decided(span, written)
        if self._pool is not None:
            fresh = [
                (w.decoded.key, w.decoded.job_type)
                for w in written
                if w.decision is Decision.NEW
                and w.result.claim is None
                and isinstance(w.decoded, Delivery)
            ]
            if fresh:
                self._pool.hand_off(fresh)
        return outcomes

    def _ingest(
        self, decoded: Sequence[Delivery | Rejection], quota: int | None
    ) -> Sequence[IngestResult | QuotaDeferred]:
        """The store's write, with the pool's free slots reserved for new rows written claimed;
        what the write claimed goes to the pool, the slots it did not fill go back (all of them
        if it raised: the commit may be in doubt, and a row it did commit claimed comes back
        to the queue when its lease runs out)."""
        pool = self._pool
        reserved = None
        if pool is not None:
            reserved = pool.reserve(d.job_type for d in decoded if isinstance(d, Delivery))
        if pool is None or reserved is None:
            if quota is None:
                return self._store.ingest(decoded)
            return self._store.ingest_within_quota(decoded, quota)
        claims: list[Claim] = []
        sent_at = time.monotonic()  # before the write: the leases it sets start later
        try:
            results = (
                self._store.ingest(decoded, reserved)
                if quota is None
                else self._store.ingest_within_quota(decoded, quota, reserved)
            )
            claims = [
                r.claim for r in results if isinstance(r, IngestResult) and r.claim is not None
            ]
        finally:
            pool.accept(reserved, claims, sent_at)
        return results

    def observe_stream(self, subscription: str, counts: Callable[[], Mapping[str, int]]) -> None:
        """A consumer's running counters, exported as metrics when telemetry is on."""
        if self._telemetry is not None:
            self._telemetry.observe_stream(subscription, counts)

    def acknowledging(self, subscription: str, count: int) -> AbstractContextManager[object]:
        """Around one acknowledging call to the broker: its span, the call's span its child."""
        if self._telemetry is None:
            return nullcontext()
        return self._telemetry.ack(self._system, subscription, count)

    def acked(self, subscription: str, received_at: float) -> None:
        """A consumer acknowledged a delivery received at ``received_at`` (monotonic)."""
        if self._telemetry is not None:
            self._telemetry.acked(subscription, time.monotonic() - received_at)


def _delivery(decoded: Delivery | Rejection) -> Delivery:
    """A deferred delivery decoded (a rejection is always recorded, never deferred)."""
    if not isinstance(decoded, Delivery):
        raise TypeError("the store deferred a rejection; rejections are always written")
    return decoded
