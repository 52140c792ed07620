"""Batched settlement: the fenced settlements of concurrent runs share one statement.

Written alone, each settlement costs a round trip and a commit (a WAL flush), and with many
workers most of a run's time is that wait. A :class:`BatchCompleter` collects the settlements
that runs hand it; one writer (the worker pool's claimer) takes whatever has gathered as a
:class:`Batch` and writes it with :meth:`~bridge.store.settle.SettleStore.settle_many`: one
statement, one commit, for the lot (the pool writes it in the transaction of the claim that
refills the workers it frees: :meth:`~bridge.store.claims.ClaimStore.settle_and_claim`). While one
batch is written the next gathers, so batches grow with the load; the pool also lets a batch
wait a moment (``settle_linger``, 2 ms) for the handlers still running, never longer.

Nothing about ownership changes. Every row moves only while its own fence is still current
(``WHERE fence = t.fence AND state = 'claimed'``, inside the write): a stale ticket in a batch
is refused alone and its run gets :class:`~bridge.errors.LeaseLost`, exactly as a single write
would have raised it, while the other rows commit. A run either waits for its own answer
(:meth:`RunSettler.settle`) or hands its settlement over with the reaction that reports it
(:meth:`RunSettler.settle_later`), which the writer calls with the answer; either way its
events, span and claim-to-settle time mean what they meant. A batch whose write fails gives
every run in it that error (for
:class:`~bridge.errors.StoreUnavailable`: the outcome is not known and the leases will lapse).
Only final settlements (succeeded, failed_terminal, unknown, quarantined) come here, never a
retry, an intent or a release, and nothing of class A: its success settles inside its own
transaction and the pool gives its runs no settler. Nothing here retries anything. Once closed,
the completer writes each settlement alone, in the caller's thread, as before batching.

Rows are sent in key order, as the heartbeater sends its renewals, so the two multi-row writes
take the rows they share in the same order. Should PostgreSQL still have to break a deadlock,
it rolls one statement back: a renewal is tried again at the next beat, a batch answers its
runs with :class:`~bridge.errors.StoreUnavailable`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress

from bridge.errors import LeaseLost
from bridge.store.settle import SettleStore
from bridge.store.work import Settlement
from bridge.types import Ticket

log = logging.getLogger(__name__)

#: the most settlements one batch writes; a pool never has more runs settling than threads
MAX_BATCH_DEFAULT = 100


#: what a final settlement's answer is given to: None (written), or the error that stopped it
Answer = Callable[[BaseException | None], None]
#: how a run's owner takes an answer: the run's own reaction to it (its events), and the answer
Finish = Callable[[Answer, BaseException | None], None]


class RunSettler:
    """One run's way to the completer; remembers whether a writer took its settlement.

    A worker whose settlement a writer took is free as soon as that write ends, whatever its
    answer: the writer counts it as idle then (and may claim its next row in the same
    transaction), so the worker must not count itself again.

    A run hands its final settlement over with :meth:`settle_later` and ends at once: its
    thread goes on to the next row while the settlement waits for a writer. The answer comes
    later, in the thread that wrote the batch, to the run's ``answered`` reaction (its events)
    through the ``finish`` its owner gave (the pool ends the run's span, heartbeat and
    accounting there). :meth:`settle` waits for the answer instead.
    """

    __slots__ = ("_completer", "_finish", "submitted", "taken")

    def __init__(self, completer: BatchCompleter, finish: Finish | None = None) -> None:
        self._completer = completer
        self._finish = finish
        self.taken = False
        #: a settlement was handed over with settle_later: the run ends when it is answered
        self.submitted = False

    def settle(self, settlement: Settlement) -> None:
        self._completer.settle(settlement, self)

    def settle_later(self, settlement: Settlement, answered: Answer) -> None:
        """Have ``settlement`` written with the next batch; ``answered`` gets its answer."""
        self.submitted = True
        finish = self._finish
        if finish is None:
            self._completer.settle_later(settlement, self, answered)
        else:
            self._completer.settle_later(settlement, self, lambda error: finish(answered, error))


class _Pending:
    """One settlement and the run waiting for its answer, or the reaction to call with it.

    A waiting run waits on a lock of its own, taken at once and released by the writer once
    the answer is in place: one wake-up of one thread, where an event shared by the batch made
    every run of it queue for the event's own lock before going on (measured:
    docs/benchmarks.md, "Worker tier"). A settlement handed over with a reaction has no
    waiter: the writer calls the reaction.
    """

    __slots__ = ("answered", "callback", "error", "run", "settlement")

    def __init__(
        self, settlement: Settlement, run: RunSettler | None, callback: Answer | None = None
    ) -> None:
        self.settlement = settlement
        self.run = run
        self.callback = callback
        self.error: BaseException | None = None
        self.answered = threading.Lock()
        if callback is None:
            self.answered.acquire()


class _Slot:
    """The settlements one batch will carry."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[_Pending] = []


def _key_order(p: _Pending) -> tuple[str, str]:
    return p.settlement.ticket.tenant_id, p.settlement.ticket.operation_id


class Batch:
    """Settlements taken for one write; every one of them is answered exactly once."""

    def __init__(self, slot: _Slot) -> None:
        slot.pending.sort(key=_key_order)
        self._pending = slot.pending
        self._answered = False

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def settlements(self) -> list[Settlement]:
        return [p.settlement for p in self._pending]

    def write(self, store: SettleStore) -> None:
        """Settle the batch in one statement and answer every run."""
        self.answer(self.settle(store))

    def settle(self, store: SettleStore) -> list[Ticket]:
        """Write the batch in one statement and return its stale tickets, answering nobody yet.

        For a writer with more to do before the runs go on (the pool hands them the rows it
        claimed meanwhile, then answers); a write that fails answers every run with its error
        before it is raised.
        """
        try:
            return store.settle_many(self.settlements)
        except BaseException as exc:
            self.fail(exc)
            raise

    def answer(self, stale: Iterable[Ticket]) -> None:
        """The write committed: the stale tickets lost their rows, the others settled. Only the
        first answer (or :meth:`fail`) counts: a batch is answered once."""
        if self._answered:
            return
        refused = set(stale)
        if refused:
            for p in self._pending:
                s = p.settlement
                if s.ticket in refused:
                    p.error = LeaseLost(
                        s.ticket.tenant_id,
                        s.ticket.operation_id,
                        s.ticket.fence,
                        f"settle as {s.state.value}",
                    )
        self._release()

    def fail(self, exc: BaseException) -> None:
        """The write failed as a whole: every run gets the error (unless answered already)."""
        if self._answered:
            return
        for p in self._pending:
            p.error = exc
        self._release()

    def _release(self) -> None:
        self._answered = True
        for p in self._pending:
            if p.callback is None:
                p.answered.release()
                continue
            try:
                p.callback(p.error)
            except Exception as exc:  # noqa: BLE001  (one reaction's bug never stops the rest)
                log.error(
                    "a settlement's answer could not be taken: %s (the row's lease will lapse "
                    "and the next claim reconciles)",
                    type(exc).__name__,
                )


class BatchCompleter:
    """Collects settlements for writers to take in batches; thread-safe.

    Settlements gather in slots of at most ``max_batch``; a writer takes the oldest slot whole,
    so several writers (the pool's claimers) may each have a batch in flight at once.
    """

    def __init__(
        self,
        store: SettleStore,
        *,
        on_pending: Callable[[], None] | None = None,
        max_batch: int = MAX_BATCH_DEFAULT,
    ) -> None:
        if max_batch < 1:
            raise ValueError("a batch holds at least one settlement")
        self._store = store
        self._on_pending = on_pending
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._slots: deque[_Slot] = deque()
        self._count = 0
        self._closed = False

    def for_run(self) -> RunSettler:
        return RunSettler(self)

    def settle_later(
        self, settlement: Settlement, run: RunSettler | None, answered: Answer
    ) -> None:
        """Have one settlement written with the next batch and return at once; ``answered``
        is called with its answer (None, :class:`~bridge.errors.LeaseLost`, or the batch's
        error) by whichever thread writes it: a writer, :meth:`close`, or, once closed, this
        thread, at once."""
        pending = _Pending(settlement, run, answered)
        with self._lock:
            slot = self._slot_for(pending)
        if slot is None:
            alone = _Slot()
            alone.pending.append(pending)
            # The error, if any, went to ``answered``: not raised here as well.
            with suppress(Exception):
                Batch(alone).write(self._store)
        elif self._on_pending is not None:
            self._on_pending()

    def _slot_for(self, pending: _Pending) -> _Slot | None:
        """The slot ``pending`` joins (None once closed). Called holding the lock."""
        if self._closed:
            return None
        slots = self._slots
        if not slots or len(slots[-1].pending) >= self._max_batch:
            slots.append(_Slot())
        slot = slots[-1]
        slot.pending.append(pending)
        self._count += 1
        return slot

    def settle(self, settlement: Settlement, run: RunSettler | None = None) -> None:
        """Have one settlement written with the next batch, and wait for its answer.

        Raises :class:`~bridge.errors.LeaseLost` when its fence is no longer current, and the
        batch's error when the batch's write failed as a whole.
        """
        pending = _Pending(settlement, run)
        with self._lock:
            slot = self._slot_for(pending)
        if slot is None:
            alone = _Slot()
            alone.pending.append(pending)
            Batch(alone).write(self._store)
        else:
            if self._on_pending is not None:
                self._on_pending()
            pending.answered.acquire()
        if pending.error is not None:
            raise pending.error

    @property
    def pending(self) -> int:
        return self._count  # one int read: no lock needed for a snapshot

    def take(self) -> Batch | None:
        """The oldest slot of settlements gathered so far (up to the batch size), for one write."""
        with self._lock:
            if not self._slots:
                return None
            slot = self._slots.popleft()
            self._count -= len(slot.pending)
            for p in slot.pending:
                if p.run is not None:
                    p.run.taken = True
        return Batch(slot)

    def close(self) -> None:
        """Write what is pending, now, in this thread; from now on each settlement writes alone."""
        with self._lock:
            self._closed = True
        while (batch := self.take()) is not None:
            try:
                batch.write(self._store)
            except Exception:  # noqa: BLE001, S112  (each run was answered with the error)
                continue
