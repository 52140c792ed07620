"""The inbox: the step every consumer shares between receiving a batch and acknowledging it.

    receive ──▶ decode (pure, never raises) ──▶ one transaction ──▶ COMMIT ──▶ ack
                                                     │
                                                     └─ fails: no ack; the broker redelivers

After :meth:`Inbox.write` returns, the database holds every delivery of the batch: as a new work
row, as a replay of an existing one, as a recorded conflict, or as a quarantined record with its
reason. Only then may the consumer acknowledge. If ``write`` raises, nothing may be
acknowledged: the broker redelivers and the redelivery is a replay or a first write. A crash
between commit and ack costs a replay, never a lost or doubled operation.

New keys are handed to the local worker pool at once (a targeted claim), so a delivery does not
wait for the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from bridge.decode import RawDelivery, undecodable
from bridge.store import PostgresStore
from bridge.telemetry import Telemetry
from bridge.types import Decision, Delivery, IngestResult, Key, Rejection, State

log = logging.getLogger(__name__)

T = TypeVar("T", bound="HeldDelivery")

Decoder = Callable[[RawDelivery], Delivery | Rejection]
HandOff = Callable[[Sequence[tuple[Key, str]]], None]


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
        """A work row exists whose outcome an ``after_outcome`` consumer waits for."""
        return self.result.decision in (Decision.NEW, Decision.REPLAY)


class Inbox:
    def __init__(
        self,
        store: PostgresStore,
        decoder: Decoder,
        *,
        hand_off: HandOff | None = None,
        system: str = "unknown",
        telemetry: Telemetry | None = None,
    ) -> None:
        self._store = store
        self._decoder = decoder
        self._hand_off = hand_off
        self._system = system
        self._telemetry = telemetry

    def decode(self, raw: RawDelivery) -> Delivery | Rejection:
        try:
            return self._decoder(raw)
        except Exception as exc:  # noqa: BLE001  (a decoder bug quarantines one delivery)
            # Type only: the error's text may quote the payload or an identifier.
            log.error("decoder raised %s; the delivery is quarantined", type(exc).__name__)
            return undecodable(raw.subscription, raw, exc)

    def write(self, batch: Sequence[RawDelivery]) -> list[Written]:
        """Decode and store a batch in one transaction. Raises if nothing may be acked."""
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
                results = self._store.ingest(decoded)
            written = [
                Written(r, d, res) for r, d, res in zip(batch, decoded, results, strict=True)
            ]
            if tel and span is not None:
                # While the receive span is still open: events on an ended span are dropped.
                tel.decided(span, written)
        if self._hand_off is not None:
            fresh = [
                (w.decoded.key, w.decoded.job_type)
                for w in written
                if w.decision is Decision.NEW and isinstance(w.decoded, Delivery)
            ]
            if fresh:
                self._hand_off(fresh)
        return written

    def observe_stream(self, subscription: str, counts: Callable[[], Mapping[str, int]]) -> None:
        """A consumer's running counters, exported as metrics when telemetry is on."""
        if self._telemetry is not None:
            self._telemetry.observe_stream(subscription, counts)

    def acked(self, subscription: str, received_at: float) -> None:
        """A consumer acknowledged a delivery received at ``received_at`` (monotonic)."""
        if self._telemetry is not None:
            self._telemetry.acked(subscription, time.monotonic() - received_at)


class HeldDelivery(Protocol):
    """A delivery an ``after_outcome`` consumer keeps in flight until its row's outcome."""

    @property
    def handle(self) -> str:
        """The broker's handle for this copy (SQS receipt handle, Pub/Sub ack id)."""
        ...

    @property
    def key(self) -> Key: ...

    @property
    def received_at(self) -> float:
        """Monotonic time of the receive."""
        ...


@dataclass(frozen=True, slots=True)
class Triage(Generic[T]):
    """What to do with each held delivery this round."""

    #: the row is terminal or parked: acknowledge
    done: list[T]
    #: the row is queued or its claim's lease is live: extend the broker's deadline
    extend: list[T]
    #: the claim stalled, the row is gone, or the hold reached its limit: let the broker redeliver
    let_go: list[T]


class HeldDeliveries(Generic[T]):
    """The deliveries an ``after_outcome`` consumer holds, by broker handle; thread-safe.

    Only the bookkeeping and the decision are here: acknowledging, extending and letting go
    are the broker's calls, made by the consumer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, T] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def add(self, held: Iterable[T]) -> None:
        with self._lock:
            for h in held:
                self._held[h.handle] = h

    def forget(self, held: Iterable[T]) -> None:
        """Stop holding these: the broker no longer honours their handles, or they are done."""
        with self._lock:
            for h in held:
                self._held.pop(h.handle, None)

    def snapshot(self) -> list[T]:
        with self._lock:
            return list(self._held.values())

    def take_all(self) -> list[T]:
        """Everything held, no longer held (on stop)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        return held

    def triage(self, store: PostgresStore, *, extension: float, limit: float) -> Triage[T]:
        """Sort held deliveries by their work rows; those done or let go are no longer held.

        A delivery is extended only while its row waits in the queue or its claim's lease is
        being renewed by handler progress; a stalled claim gets no more broker time, so the
        broker redelivers it (a replay). ``limit`` caps the total hold from the receive,
        counting the ``extension`` about to be granted.
        """
        triage: Triage[T] = Triage([], [], [])
        held = self.snapshot()
        if not held:
            return triage
        rows = store.watch(list({h.key for h in held}))
        now = time.monotonic()
        for h in held:
            row = rows.get(h.key)
            if row is None:
                triage.let_go.append(h)
                continue
            state, lease_live = row
            if state.terminal or state.parked:
                triage.done.append(h)
            elif now - h.received_at + extension >= limit:
                triage.let_go.append(h)
            elif state is State.QUEUED or lease_live:
                triage.extend.append(h)
            else:
                triage.let_go.append(h)
        self.forget(triage.done + triage.let_go)
        return triage
