"""Held deliveries (``after_outcome``): broker copies kept in flight until their rows settle.

A held copy has a broker deadline: the moment its SQS visibility or Pub/Sub ack deadline ends.
The :class:`Holder` keeps each copy's deadline itself and acts on it:

- **extend** a copy whose row is queued or whose claim's lease is live once its own deadline
  comes within ``margin``, earliest deadline first, in batches of the broker's size;
- **settle** (delete / ack) a copy whose row is terminal or parked, as soon as a watch of the
  rows shows it, never waiting for the copy's deadline;
- **let go** of a copy whose claim stalled, whose row is gone, or whose hold reached ``limit``:
  it is no longer extended and the broker redelivers it (a replay);
- on stop, **release** every copy still held (visibility 0 / nack), so another replica takes it
  at once instead of after its deadline.

Copies can come in **ack groups** (``order``: a Pub/Sub ordering key on an ordered
exactly-once subscription): the broker confirms a copy's acknowledgement only once those of
the copies delivered before it in its group are, and refuses an early one. A copy of a group is
therefore acknowledged only at the head of its group, together with the ready copies right
behind it, in delivery order, in one call; a later copy whose row settled first waits, extended
as any held copy, and is never sent early. Copies of no group never wait for anything.

Broker calls run on a small pool of call threads, never on the scheduling thread: a slow or
failing call delays only its own batch, and deletes never queue in front of extensions. A
transient failure is retried with jittered exponential backoff (tenacity) for as long as the
copy's deadline allows. A refused extension (the broker no longer honours the handle) is a lost
broker lease: counted, forgotten, and the broker's redelivery is a replay.

Deadlines are estimated early, never late: a receive's copy from the answer time plus the lease
the receive asked for (the broker starts the clock while answering); an extension's from the
moment its request was *sent* plus the seconds granted (the broker may apply it at once, even if
its answer arrives late).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice, takewhile
from operator import itemgetter
from typing import Any, Generic, Protocol, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_result,
    stop_after_delay,
    stop_any,
    stop_when_event_set,
    wait_random_exponential,
)

from bridge.service import Deadline, Service, Supervised
from bridge.types import Key, State

log = logging.getLogger(__name__)

Item = TypeVar("Item")

#: keys per watch statement
WATCH_CHUNK = 1000
#: how often held rows are watched for a settled outcome (seconds)
SETTLE_INTERVAL_DEFAULT = 0.5
CALL_THREADS_DEFAULT = 4
#: the retry pause of a failed broker call grows from this (seconds, jittered) ...
_RETRY_INITIAL = 0.1
#: ... up to this
_RETRY_MAX = 2.0
#: seconds an acknowledgement is retried in one round before its copy goes back to being held
_SETTLE_TRY = 4.0
#: share of the margin by which a copy's extension may come early to fill a batch
_BATCH_AHEAD = 0.5
#: seconds an extension is retried at least (a copy past its estimated deadline may still be
#: leased: the estimate errs early)
_EXTEND_BUDGET_MIN = 2.0
#: seconds an acknowledgement is tried at least, even when its copy's extension is due
_SETTLE_TRY_MIN = 0.25


class HeldDelivery(Protocol):
    """A delivery an ``after_outcome`` consumer keeps in flight until its row's outcome."""

    @property
    def handle(self) -> str:
        """The broker's handle for this copy (SQS receipt handle, Pub/Sub ack id)."""
        ...

    @property
    def key(self) -> Key | None:
        """The work row whose outcome the copy waits for; None for a copy already settled."""
        ...

    @property
    def received_at(self) -> float:
        """Monotonic time of the receive."""
        ...


T = TypeVar("T", bound=HeldDelivery)


@dataclass(frozen=True, slots=True)
class CallResult(Generic[Item]):
    """What the broker said of one batch call, copy by copy."""

    #: confirmed by the broker
    done: Sequence[Item] = ()
    #: refused for good: the broker no longer honours these handles
    lost: Sequence[Item] = ()
    #: not confirmed (a transient failure or no answer): worth trying again
    retry: Sequence[Item] = ()


class BrokerLeases(Protocol[T]):
    """The broker calls a :class:`Holder` makes. Each may block; each runs on a call thread.

    A call that raises counts as ``retry`` for its whole batch.
    """

    #: the most copies one call may carry (SQS batch calls take 10)
    max_batch: int

    def settle(self, held: Sequence[T]) -> CallResult[T]:
        """Acknowledge (Pub/Sub ack, SQS delete) copies whose rows settled."""
        ...

    def extend(self, held: Sequence[T], seconds: float) -> CallResult[T]:
        """Push each copy's deadline to ``seconds`` from now."""
        ...

    def release(self, held: Sequence[T]) -> None:
        """Hand copies back now (SQS visibility 0, Pub/Sub nack); best effort."""
        ...


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    #: monotonic time the broker's lease on this copy ends (estimated early)
    deadline: float
    #: a broker call about this copy is in flight
    busy: bool = False
    #: bumped when the deadline moves, so stale heap entries are skipped
    version: int = 0
    #: last state seen by a watch: None until the first watch
    progressing: bool | None = None
    #: an acknowledgement of this copy went unconfirmed: it is tried again, and extended
    settle_retried: bool = False
    #: nothing to wait for (a conflict, a quarantined delivery): acknowledge at once
    settled: bool = False


@dataclass(frozen=True, slots=True)
class _Sorted(Generic[T]):
    settle: list[_Entry[T]] = field(default_factory=list)
    extend: list[_Entry[T]] = field(default_factory=list)
    let_go: list[_Entry[T]] = field(default_factory=list)


class RowWatch(Protocol):
    """What a holder reads of the work rows (the work store gives it): for each key, its row's
    state and whether its claim's lease is live. Declared here, by its one user, so that an
    adapter needs nothing of the store."""

    def watch(self, keys: Sequence[Key]) -> dict[Key, tuple[State, bool]]: ...


class Holder(Generic[T]):
    """Keeps one consumer's held copies alive at the broker until their rows settle."""

    def __init__(
        self,
        name: str,
        store: RowWatch,
        broker: BrokerLeases[T],
        *,
        extension: float,
        limit: float,
        margin: float | None = None,
        settle_interval: float = SETTLE_INTERVAL_DEFAULT,
        call_threads: int = CALL_THREADS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        supervise: Callable[..., Supervised] = Supervised,
        on_settled: Callable[[Sequence[T]], None] | None = None,
        order: Callable[[T], tuple[str, int] | None] | None = None,
    ) -> None:
        """``supervise`` builds the scheduling loop's service (a consumer passes its inbox's
        :meth:`~bridge.ingest.inbox.Inbox.supervised`, so the loop counts and reports like the
        core's). ``on_settled`` is told of every copy whose acknowledgement the broker confirmed
        (a consumer records its receive-to-ack time there, unless its broker calls do).
        ``order`` gives a copy's ack group and its place in it (see the module), asked each
        round (a consumer may learn that the broker orders more than it said).
        """
        if extension <= 0 or limit <= 0:
            raise ValueError("extension and limit must be positive")
        self.name = name
        self._store = store
        self._broker = broker
        self._extension = extension
        self._limit = limit
        #: extend this long before a copy's deadline: half the extension leaves room for one
        #: slow call and one retry before the copy is lost
        self._margin_given = margin
        self._margin = extension / 2 if margin is None else margin
        self._settle_interval = settle_interval
        self._clock = clock
        self._on_settled = on_settled
        self._order = order
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry[T]] = {}
        self._due: list[tuple[float, int, int, str]] = []
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        #: extensions and acknowledgements on pools of their own: a burst of one never queues
        #: in front of the other
        self._extend_calls = ThreadPoolExecutor(call_threads, thread_name_prefix=f"hold-{name}-x")
        self._settle_calls = ThreadPoolExecutor(call_threads, thread_name_prefix=f"hold-{name}-a")
        self.service = supervise(
            f"hold:{name}",
            self._round,
            label="holder",
            stop=self._stopping,
            wake=self._wake.set,
            thread_name=f"hold-{name}",
        )
        self._error: str | None = None
        self.counts: Counter[str] = Counter()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.service.start()

    def stop(self, deadline: float = 10.0) -> None:
        """Stop extending and release every copy still held, within ``deadline`` seconds."""
        end = time.monotonic() + deadline
        self._stopping.set()
        self._wake.set()
        self.service.join(Deadline(max(end - time.monotonic(), 0)))
        # Calls in flight end soon (their retries stop with us); release only after them, so a
        # late extension cannot undo a release.
        closers = [
            threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
            for pool in (self._extend_calls, self._settle_calls)
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(timeout=max(end - time.monotonic(), 0))
        held = self.take_all()
        for chunk in _chunks(held, self._broker.max_batch):
            if time.monotonic() > end:
                break
            try:
                self._broker.release(chunk)
            except Exception as exc:  # noqa: BLE001  (best effort: the deadline returns them)
                log.info("%s: could not release held copies (%s)", self.name, type(exc).__name__)
                continue
            self._count("released", len(chunk))

    def set_extension(self, seconds: float) -> None:
        """The lease each extension asks for, from now on (a subscription's ack deadline)."""
        if seconds <= 0:
            raise ValueError("an extension must be positive")
        self._extension = seconds
        self._margin = seconds / 2 if self._margin_given is None else self._margin_given

    def status(self) -> tuple[bool, str]:
        loop = self.service.status()
        if not loop.ready and loop.reason != "not started" and not self._stopping.is_set():
            return False, f"{self.name}: {loop.reason}"
        if self._error:
            return False, f"{self.name}: {self._error}"
        return True, "ok"

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.counts[name] += n

    # -- holding ------------------------------------------------------------------------------

    def hold(self, items: Sequence[T], deadline: float, *, settled: bool = False) -> None:
        """Hold these copies; the broker's lease on them ends at ``deadline`` (monotonic).

        ``settled`` copies wait for no row: they are acknowledged at once, and kept (extended)
        only while the broker does not confirm it.
        """
        if not items:
            return
        with self._lock:
            for item in items:
                entry = _Entry(item, deadline, settled=settled or item.key is None)
                self._entries[item.handle] = entry
                self._schedule(entry)
        self._count("held", len(items))
        self._wake.set()

    def forget(self, items: Iterable[T]) -> None:
        """Stop holding these copies (their handles are void)."""
        with self._lock:
            for item in items:
                self._entries.pop(item.handle, None)

    def take_all(self) -> list[T]:
        with self._lock:
            held = [e.item for e in self._entries.values()]
            self._entries.clear()
            self._due.clear()
        return held

    def _schedule(self, entry: _Entry[T]) -> None:
        """Put ``entry`` on the timetable at its deadline less the margin (lock held)."""
        entry.version += 1
        due = entry.deadline - self._margin
        heapq.heappush(self._due, (due, next(self._seq), entry.version, entry.item.handle))

    # -- the scheduling thread ----------------------------------------------------------------

    def _round(self) -> None:
        """One round, then the wait for the next; the supervisor logs, counts and backs off
        after a failure (the copies' deadlines are on the timetable: the next round catches up).
        """
        try:
            self._error = self._tick()
        except Exception:
            self._count("tick_failed")
            raise
        self._wake.wait(self._pause())
        self._wake.clear()

    def _pause(self) -> float:
        """Until the next copy is due, or the next settle watch, whichever comes first."""
        with self._lock:
            if not self._entries:
                return self._settle_interval * 4
            nxt = self._due[0][0] if self._due else float("inf")
        return max(min(nxt - self._clock(), self._settle_interval), 0.01)

    def _tick(self) -> str | None:
        """One round; returns why the round could not do all it should, if it could not."""
        with self._lock:
            idle = [e for e in self._entries.values() if not e.busy]
        if not idle:
            return None
        rows: dict[Key, tuple[State, bool]] | None
        problem: str | None = None
        try:
            rows = self._watch([e.item.key for e in idle if e.item.key is not None])
        except Exception as exc:  # noqa: BLE001  (the database is slow or gone: keep extending)
            self._count("watch_failed")
            problem = f"cannot watch held rows ({type(exc).__name__})"
            rows = None
        now = self._clock()
        sorted_ = self._sort(idle, rows, now)
        if sorted_.let_go:
            self.forget(e.item for e in sorted_.let_go)
            self._count("let_go", len(sorted_.let_go))
        for chunk in _chunks(sorted_.extend, self._broker.max_batch):
            self._submit(self._extend_calls, self._extend, chunk)
        for chunk in self._settle_chunks(sorted_.settle):
            self._submit(self._settle_calls, self._settle, chunk)
        return problem

    def _settle_chunks(self, settle: list[_Entry[T]]) -> list[list[_Entry[T]]]:
        """Calls of at most ``max_batch`` copies; the copies of one group go in one call, in
        the order given (calls run in parallel: two calls of a group could arrive swapped)."""
        if self._order is None:
            return _chunks(settle, self._broker.max_batch)
        runs: dict[str | None, list[_Entry[T]]] = {}
        free: list[list[_Entry[T]]] = []
        for entry in settle:
            place = self._order(entry.item)
            if place is None:
                free.append([entry])
            else:
                runs.setdefault(place[0], []).append(entry)
        calls: list[list[_Entry[T]]] = []
        for run in [*runs.values(), *free]:
            if calls and len(calls[-1]) + len(run) <= self._broker.max_batch:
                calls[-1].extend(run)
            else:
                calls.append(list(run))
        return calls

    def _watch(self, keys: list[Key]) -> dict[Key, tuple[State, bool]]:
        rows: dict[Key, tuple[State, bool]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), WATCH_CHUNK):
            rows.update(self._store.watch(unique[i : i + WATCH_CHUNK]))
        return rows

    def _sort(
        self, idle: list[_Entry[T]], rows: dict[Key, tuple[State, bool]] | None, now: float
    ) -> _Sorted[T]:
        """Which copies to settle, extend now, or let go; the rest wait for their turn."""
        out: _Sorted[T] = _Sorted()
        with self._lock:
            due = self._pop_due(now)
            seen = {e.item.handle for e in idle}
            for handle in due - seen:
                # Held since the watch began (or busy): back on the timetable for the next round.
                late = self._entries.get(handle)
                if late is not None and not late.busy:
                    self._schedule(late)
            ready: list[_Entry[T]] = []
            for entry in idle:
                if entry.item.handle not in self._entries:
                    continue
                decision = self._decide(out, entry, rows, entry.item.handle in due, now)
                if decision is out.settle:
                    ready.append(entry)
                elif decision is not None:
                    entry.busy = decision is not out.let_go
                    decision.append(entry)
            now_sent = self._in_order(ready)
            sent = {e.item.handle for e in now_sent}
            for entry in now_sent:
                entry.busy = True
                out.settle.append(entry)
            for entry in ready:
                # Waiting for an earlier copy of its group: kept leased meanwhile.
                if entry.item.handle not in sent and entry.item.handle in due:
                    entry.busy = True
                    out.extend.append(entry)
        return out

    def _in_order(self, ready: list[_Entry[T]]) -> list[_Entry[T]]:
        """Of the copies ready to be acknowledged, those that may be sent now (lock held): every
        copy of no group, and of each group the ready copies from its head on, in delivery
        order, up to the first copy that is not ready (still waiting for its row, or busy), at
        most one call's worth."""
        if self._order is None:
            return ready
        places = {handle: self._order(e.item) for handle, e in self._entries.items()}
        ready_handles = {e.item.handle for e in ready}
        groups: dict[str, list[tuple[int, _Entry[T]]]] = {}
        for handle, place in places.items():
            if place is not None:
                groups.setdefault(place[0], []).append((place[1], self._entries[handle]))
        ordered: list[_Entry[T]] = []
        for members in groups.values():
            members.sort(key=itemgetter(0))
            run = takewhile(lambda m: m[1].item.handle in ready_handles, members)
            ordered.extend(e for _, e in islice(run, self._broker.max_batch))
        free = [e for e in ready if places.get(e.item.handle) is None]
        return [*ordered, *free]

    def _decide(
        self,
        out: _Sorted[T],
        entry: _Entry[T],
        rows: dict[Key, tuple[State, bool]] | None,
        due: bool,
        now: float,
    ) -> list[_Entry[T]] | None:
        """The list of ``out`` this copy goes to this round, or None to wait (lock held)."""
        settled = entry.settled
        if not settled and rows is not None and entry.item.key is not None:
            row = rows.get(entry.item.key)
            if row is None:
                return out.let_go  # the row is gone (erased)
            state, lease_live = row
            settled = state.terminal or state.parked
            entry.progressing = state is State.QUEUED or lease_live
        if settled:
            # An acknowledgement that waits on the broker keeps its copy leased meanwhile.
            return out.extend if entry.settle_retried and due else out.settle
        if not due:
            return None
        too_long = now - entry.item.received_at + self._extension >= self._limit
        if too_long or entry.progressing is False:
            return out.let_go
        # Progressing, or not watched yet (the database did not answer): keep it.
        return out.extend

    def _pop_due(self, now: float) -> set[str]:
        """Handles whose extension is due (lock held); stale timetable entries are dropped.

        Copies due soon after (within half the margin) come along until the last batch is
        full: deadlines spread out, and one call per copy or two would multiply the broker
        calls (and their latency under load) for leases that end moments apart.
        """
        due: set[str] = set()
        ahead = now + self._margin * _BATCH_AHEAD
        while self._due:
            at, _, version, handle = self._due[0]
            if at > now and (not due or at > ahead or len(due) % self._broker.max_batch == 0):
                break
            heapq.heappop(self._due)
            entry = self._entries.get(handle)
            if entry is not None and entry.version == version:
                due.add(handle)
        return due

    # -- broker calls, on the call threads ----------------------------------------------------

    def _submit(
        self,
        pool: ThreadPoolExecutor,
        call: Callable[[list[_Entry[T]]], None],
        chunk: list[_Entry[T]],
    ) -> None:
        try:
            pool.submit(self._guarded, call, chunk)
        except RuntimeError:  # shut down: stop() releases what is left
            self._idle(chunk)

    def _guarded(self, call: Callable[[list[_Entry[T]]], None], chunk: list[_Entry[T]]) -> None:
        try:
            call(chunk)
        except Exception as exc:  # noqa: BLE001  (a call thread never dies)
            self._count("call_failed")
            log.warning("%s: a held-delivery call failed (%s)", self.name, type(exc).__name__)
            self._idle(chunk)

    def _idle(self, chunk: list[_Entry[T]]) -> None:
        with self._lock:
            for entry in chunk:
                entry.busy = False
                if entry.item.handle in self._entries:
                    self._schedule(entry)
        self._wake.set()

    def _settle(self, chunk: list[_Entry[T]]) -> None:
        """Acknowledge; what stays unconfirmed is still held, so it is extended and tried again.

        An acknowledgement can be refused for a while for reasons of the broker's own (with
        Pub/Sub ordering, a copy is acknowledged only after the copies before it of the same
        key): giving up would let the copy lapse and the broker hand out it and every later
        copy of its key again. Only ``limit`` ends a hold.
        """
        # Tried until the earliest copy's extension is due, at most _SETTLE_TRY: a copy whose
        # ack waits on the broker must not stay busy past the moment it has to be extended.
        due = min(e.deadline for e in chunk) - self._margin - self._clock()
        budget = min(max(due, _SETTLE_TRY_MIN), _SETTLE_TRY)
        done, lost, left = confirm(
            self._broker.settle,
            [e.item for e in chunk],
            budget=budget,
            stopping=self._stopping,
            name=self.name,
        )
        self.forget([*done, *lost])
        self._count("settled", len(done))
        self._count("settle_refused", len(lost))
        if left:
            self._count("settle_retried", len(left))
            keep = {item.handle for item in left}
            retried = [e for e in chunk if e.item.handle in keep]
            for e in retried:
                e.settle_retried = True
            self._idle(retried)
        if done and self._on_settled is not None:
            self._on_settled(done)

    def _extend(self, chunk: list[_Entry[T]]) -> None:
        sent = self._clock()
        # Worth retrying while the copies are still leased, less a moment for the last try;
        # briefly even when the estimate says the deadline passed (it errs early).
        budget = max(min(e.deadline for e in chunk) - sent - 0.2, _EXTEND_BUDGET_MIN)
        seconds = self._extension

        def extend(items: Sequence[T]) -> CallResult[T]:
            nonlocal sent
            sent = self._clock()
            return self._broker.extend(items, seconds)

        done, lost, left = confirm(
            extend, [e.item for e in chunk], budget=budget, stopping=self._stopping, name=self.name
        )
        by_handle = {e.item.handle: e for e in chunk}
        with self._lock:
            for item in done:
                entry = by_handle[item.handle]
                # From the send of the last try: the broker may have applied it at once.
                entry.deadline = sent + seconds
                entry.busy = False
                if item.handle in self._entries:
                    self._schedule(entry)
            for item in [*lost, *left]:
                self._entries.pop(item.handle, None)
        self._count("extended", len(done))
        # Unconfirmed until the deadline passed: the lease must be taken as lost too.
        self._count("broker_lease_lost", len(lost) + len(left))
        if lost or left:
            log.info("%s: %d broker lease(s) lost", self.name, len(lost) + len(left))
        self._wake.set()


def _chunks(items: Sequence[Item], size: int) -> list[list[Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), max(size, 1))]


def confirm(
    call: Callable[[Sequence[Item]], CallResult[Item]],
    items: Sequence[Item],
    *,
    budget: float,
    stopping: threading.Event,
    name: str,
) -> tuple[list[Item], list[Item], list[Item]]:
    """Call; retry what the broker did not confirm, jittered and backed off, within ``budget``.

    Returns (confirmed, refused for good, still unconfirmed when the budget or the consumer ran
    out). A call that raises leaves its whole batch unconfirmed; it never propagates.
    """
    done: list[Item] = []
    lost: list[Item] = []
    pending: list[Item] = list(items)

    def attempt() -> list[Item]:
        nonlocal pending
        try:
            result = call(pending)
        except Exception as exc:  # noqa: BLE001  (the whole batch is unconfirmed)
            log.info("%s: broker call failed (%s)", name, type(exc).__name__)
            return pending
        done.extend(result.done)
        lost.extend(result.lost)
        pending = list(result.retry)
        return pending

    def give_up(_state: RetryCallState) -> list[Item]:
        return pending

    def pause(seconds: float) -> None:
        stopping.wait(seconds)

    retrying = Retrying(
        stop=stop_any(stop_after_delay(budget), stop_when_event_set(stopping)),
        wait=wait_random_exponential(multiplier=_RETRY_INITIAL, max=_RETRY_MAX),
        retry=retry_if_result(bool),
        retry_error_callback=give_up,
        sleep=pause,
    )
    left: list[Item] = retrying(attempt)
    return done, lost, left


def stream_status(
    subscription: str,
    loops: Sequence[Service],
    error: str | None,
    *,
    holder: Holder[Any] | None,
    counts: Mapping[str, int],
    shown: Sequence[str],
) -> tuple[bool, str]:
    """A consumer's readiness: a loop that is failing or ended, its error or its holder's;
    else its counters."""
    for loop in loops:
        status = loop.status()
        if not status.ready and status.reason != "not started":
            return False, f"{subscription}: {status.name}: {status.reason}"
    if error:
        return False, f"{subscription}: {error}"
    if holder is not None:
        ok, why = holder.status()
        if not ok:
            return False, why
    listed = ", ".join(f"{name} {counts[name]}" for name in shown if counts.get(name))
    return True, f"ok ({listed})" if listed else "ok"
