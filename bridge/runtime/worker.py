"""The worker pool: claimer threads on one side of a queue, worker threads on the other.

A claimer claims only as many rows as there are free slots (or slots whose settlements it is
writing), and reserves those slots while its statement runs, so the rows a pool holds never
exceed its threads and its prefetch, and two claimers never claim for the same slot. The
inbox reserves free slots the same way for the new rows of a batch it is about to write
(:meth:`WorkerPool.reserve`), writes that many already claimed, and hands them over
(:meth:`WorkerPool.accept`): new work usually costs no claim statement. Keys a consumer
inserted queued are claimed by key (hand-off) when one round can take them all. The general
claim, of any claimable row of the job types the pool runs (queued rows nobody handed off,
retries that came due, expired leases of crashed workers, other replicas' and redriven rows),
keeps its own schedule whatever the hand-off holds: again at once while it fills its batch, a
poll interval after it came back short. While rows wait beyond what one round takes (a
backlog), the general claim's order decides (tenants in turn, priorities): the hand-off keeps
no more keys than the pool has slots (more are dropped, their rows claimed in that order), and
the inbox writes new rows queued, behind the waiting ones.

Stopping: the claimer stops first; claims that never reached a handler are released (the
attempt is not counted); running handlers get until the deadline to finish. Past it they are
abandoned: their context reports the lease as lost, and nothing is written for them, so their
rows come back through lease expiry and the next claim reconciles.

The claimer and every worker run as supervised services (:mod:`bridge.service`): an exception
out of a claim or a run, of whatever type, is logged by type, counted and followed by a
jittered, capped backoff, and the loop carries on; while claims fail the pool is not ready.

Final settlements of concurrent runs are written together: runs hand them to a
:class:`~bridge.executors.completer.BatchCompleter` and a claimer writes what has gathered
(each row under its own fence) in the transaction of the claim that refills the slots they
free: one commit for both (:meth:`~bridge.store.claims.ClaimStore.settle_and_claim`). A run
hands its settlement over and its thread takes the next row at once; the run ends when the
answer comes, in the claimer's thread: its events, its span and its claim-to-settle time are
reported then, so they mean what a run that waited for its answer would have reported. A
claimer keeps one connection for its statements
(:meth:`~bridge.store.db.Database.keep_connection`).

The pool holds at most ``threads + prefetch`` rows: one per thread, and ``prefetch`` claimed
ahead (default :data:`PREFETCH_DEFAULT`), which wait in the queue for a thread while the next
claim round is in flight, so that the round trip of a claim overlaps the runs instead of
following them. A row whose lease ran out while it waited is given back unrun. A slot is free
again once its run ended, or once the claimer took the run's settlement for writing (it
claims for those slots in the same transaction).

Several claimers (``claimers``, default 1: see :data:`CLAIMERS_DEFAULT`), each with its own
connection, overlap: while one claimer's round is in flight the next batch of settlements
gathers and another claimer writes it. Before writing, a claimer lingers for the
handlers still running (``settle_linger`` at most), and stops as soon as its share of the
workers has settled or no settlement arrived for a quarter of the linger.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from opentelemetry import trace
from opentelemetry.trace import Span

from bridge.config import PREFETCH_DEFAULT, default_worker_id
from bridge.errors import LeaseLost, StoreUnavailable
from bridge.events import EventCounter, FanOut, WorkEvents
from bridge.executors import Run, execute
from bridge.executors.completer import Answer, Batch, BatchCompleter, RunSettler
from bridge.executors.registry import Registry
from bridge.handlers import Context, SameDatabaseHandler
from bridge.identity import IdentityHasher
from bridge.runtime.heartbeat import Heartbeater, InFlight, StuckRuns
from bridge.service import Backoff, Deadline, Limits, Service, ServiceGroup, Supervised
from bridge.store.postgres import PostgresStore
from bridge.store.replication import StandbyGate
from bridge.telemetry import Telemetry
from bridge.types import Claim, InsertClaim, Key, State, TargetClass, Ticket

log = logging.getLogger(__name__)

WORKER_THREADS_DEFAULT = 8
#: claim rounds in flight at once, by default. One: measured on two cores with the database
#: beside the pool, a second claimer split the batches and cost more CPU per job than its
#: overlap saved (docs/benchmarks.md, "Worker tier"). More may pay where round trips are long
#: (a remote database); measure before raising it. Where the CPU is the limit, run replicas.
CLAIMERS_DEFAULT = 1
POLL_INTERVAL_DEFAULT = 1.0
#: how long settlements wait for the other running handlers to finish, to share their commit
SETTLE_LINGER_DEFAULT = 0.002
#: how long an idle worker waits for a claim before its round ends (and a failure clears)
WORKER_ROUND_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class StopReport:
    released: int
    finished: int
    abandoned: int


class WorkerPool:
    def __init__(
        self,
        store: PostgresStore,
        registry: Registry,
        hasher: IdentityHasher,
        *,
        worker_id: str | None = None,
        threads: int = WORKER_THREADS_DEFAULT,
        claim_batch: int | None = None,
        claimers: int = CLAIMERS_DEFAULT,
        prefetch: int = PREFETCH_DEFAULT,
        poll_interval: float = POLL_INTERVAL_DEFAULT,
        settle_linger: float = SETTLE_LINGER_DEFAULT,
        events: WorkEvents | None = None,
        telemetry: Telemetry | None = None,
        backoff: Backoff | None = None,
        limits: Limits | None = None,
        standby: StandbyGate | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError("a worker pool needs at least one thread")
        if claimers < 1:
            raise ValueError("a worker pool needs at least one claimer")
        if claim_batch is not None and claim_batch < 1:
            raise ValueError("a claim leases at least one row")
        if prefetch < 0:
            raise ValueError("prefetch is a number of rows, 0 or more")
        self.worker_id = worker_id or default_worker_id()
        self.counts = EventCounter()
        receivers: list[WorkEvents] = [self.counts]
        receivers += [r for r in (events, telemetry) if r is not None]
        self._events: WorkEvents = FanOut(*receivers) if len(receivers) > 1 else self.counts
        self._telemetry = telemetry
        self._standby = standby
        self._store = store
        self._registry = registry
        self._hasher = hasher
        self._threads = threads
        #: the most rows the pool holds at once: one per thread, and the prefetched ones
        self._slots = threads + prefetch
        #: most rows per claim statement; by default every worker's refill in one
        self._claim_batch = claim_batch or self._slots
        self._poll = poll_interval
        self._settle_linger = settle_linger
        # A SimpleQueue: one claim goes through it per job, and its put and get (in C) cost a
        # fraction of queue.Queue's, whose joins and bounds the pool does not use.
        self._work: queue.SimpleQueue[tuple[Claim, float] | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        #: free slots (rows the pool may still hold) no claimer has reserved
        self._idle = self._slots
        #: slots reserved by claimers whose statements are in flight
        self._reserved = 0
        #: a claimer's share of the workers: settled that many, it stops lingering
        self._share = max(1, -(-threads // claimers))
        #: keys the inbox wrote queued, to claim by key while one round takes them all; never
        #: more than the pool's slots (more are a backlog, the general claim's)
        self._handoff: dict[Key, str] = {}
        #: when the general claim (any claimable row, handed off or not) is next due: at once
        #: while the last one filled its batch, else a poll interval after it came back short,
        #: whatever the hand-off holds
        self._rescue_at = 0.0
        #: rows wait in the database beyond what the pool can take in one round (the last
        #: general claim filled its batch, or more keys were handed off than it holds): the
        #: general claim's order decides which go first (tenants in turn, priorities), and the
        #: inbox writes new rows queued, behind them
        self._backlog = False
        #: hand-offs that overflowed, counted: a round that began before one does not end the
        #: backlog it made
        self._overflows = 0
        #: rows of an ordered group or under a concurrency limit, until their runs end: the
        #: end of one may free the next row for the general claim (a row written claimed is
        #: neither)
        self._freeing: set[Ticket] = set()
        self._stopping = threading.Event()
        self._completer = BatchCompleter(store.settle, on_pending=self._settlement_arrived)
        on_restart = telemetry.thread_restarted if telemetry is not None else None
        self.heartbeater = Heartbeater(
            store.settle,
            self._events,
            interval=Heartbeater.interval_for([s.lease for s in registry.specs()]),
            limits=limits,
            on_restart=on_restart,
            sleep=backoff.sleep if backoff is not None else None,
        )
        # Claims wait on the stop event after a failure, never on the condition: new hand-offs
        # and settlements must not cut the pause short while the database is failing.
        self._claimers = [
            Supervised(
                "claimer" if i == 0 else f"claimer-{i + 1}",
                self._claim_round,
                label="claimer",
                stop=self._stopping,
                wake=self.wake,
                after=self._claimer_ended,
                backoff=backoff,
                limits=limits,
                on_restart=on_restart,
            )
            for i in range(claimers)
        ]
        self._claimer_group = ServiceGroup("claimer", self._claimers)
        #: runs that hold their threads more than one lease past their leases, for the probes
        self.stuck = StuckRuns(self.heartbeater, threads)
        self._workers = ServiceGroup(
            "workers",
            [
                Supervised(
                    f"worker-{i}",
                    partial(self._work_round, done),
                    label="worker",
                    # Not "fencebridge-worker-N": the connection pool's own threads are named so.
                    thread_name=f"fencebridge-handler-{i}",
                    stop=done,
                    backoff=backoff,
                    limits=limits,
                    on_restart=on_restart,
                )
                for i, done in enumerate(threading.Event() for _ in range(threads))
            ],
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.heartbeater.start()
        self._workers.start()
        self._claimer_group.start()

    def services(self) -> list[Service]:
        """The pool's supervised parts, for health: claimers, workers, heartbeater, and the
        runs stuck on the workers' threads."""
        return [self._claimer_group, self._workers, self.heartbeater.service, self.stuck]

    @property
    def claimer(self) -> Supervised:
        """The first claimer (``/readyz`` reports them all as one ``claimer``)."""
        return self._claimers[0]

    @property
    def claimers(self) -> list[Supervised]:
        return list(self._claimers)

    @property
    def healthy(self) -> bool:
        """False while claims are failing (the database unreachable, refusing, read-only)."""
        return self._claimer_group.status().ready

    def hand_off(self, items: Iterable[tuple[Key, str]]) -> None:
        """Keys just inserted queued by a consumer, with their job types, to claim by key when
        one round can take them all. More than the pool holds are a backlog: the keys are
        dropped (their rows are queued) and the general claim is due at once, which takes
        them in its order beside every other claimable row."""
        with self._cond:
            for key, job_type in items:
                if job_type in self._registry:
                    self._handoff[key] = job_type
            if len(self._handoff) > self._slots:
                self._handoff.clear()
                self._overflows += 1
                self._backlog = True
                self._rescue_at = 0.0
            self._cond.notify_all()

    def reserve(self, job_types: Iterable[str]) -> InsertClaim | None:
        """Slots for the new rows of a batch the inbox is about to write (one job type per
        delivery), which it may then write already claimed (:class:`InsertClaim`); None when
        there is no free slot, no job type this pool runs, or the pool is stopping, and while
        rows wait in the database for the general claim (a new row written claimed would go
        ahead of them, whatever their tenants and priorities). The slots stay reserved until
        :meth:`accept` gives back what the write did not claim."""
        wanted = 0
        leases: dict[str, timedelta] = {}
        for job_type in job_types:
            spec = self._registry.get(job_type)
            if spec is not None:
                wanted += 1
                leases[job_type] = spec.lease
        if wanted == 0:
            return None
        with self._cond:
            if self._stopping.is_set() or self._idle == 0 or self._backlog:
                return None
            taken = min(wanted, self._idle)
            self._idle -= taken
            self._reserved += taken
        return InsertClaim(self.worker_id, leases, taken)

    def accept(self, reserved: InsertClaim, claims: Sequence[Claim], sent_at: float) -> None:
        """The rows the inbox wrote claimed for ``reserved`` (none if its write failed), queued
        for the workers as a claim's rows are; the slots they did not fill are free again.
        ``sent_at`` is a monotonic time before the write was sent: their leases start later."""
        if len(claims) > reserved.limit:
            raise ValueError("more rows written claimed than slots reserved for them")
        with self._cond:
            self._reserved -= reserved.limit
            self._idle += reserved.limit - len(claims)
            if len(claims) < reserved.limit:
                self._cond.notify_all()
        if claims:
            self._hand_over(list(claims), sent_at, [])

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _settlement_arrived(self) -> None:
        """Wake the claimers only when it changes what they do: the first settlement of a batch
        (a claimer may be waiting for any work), or the last of the running handlers (a
        lingering claimer may stop). Between those a lingering claimer polls the count."""
        pending = self._completer.pending
        if pending <= 1 or pending >= self._slots - self._idle - self._reserved:
            self.wake()

    def stop(self, deadline: float | Deadline = 30.0) -> StopReport:
        """Stop claiming, release unstarted claims, wait for running handlers until deadline.

        A claim the claimer is still writing when its join gives up is released by the claimer
        itself once the statement returns: nothing is queued after the stop began.
        """
        until = Deadline.of(deadline)
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
        self._claimer_group.join(until)
        released = 0
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None and self._release(item[0]):
                released += 1
        for _ in self._workers.members:
            self._work.put(None)
        self._workers.join(until)
        # Settlements of runs that outlive the claimer (or the deadline) are written alone.
        self._completer.close()
        abandoned = self.heartbeater.inflight()
        for entry in abandoned:
            entry.ctx.lease_lost.set()
        self.heartbeater.stop(until)
        finished = sum(1 for w in self._workers.members if w.join(Deadline(0)))
        if abandoned:
            log.warning(
                "stopped with %d handler(s) still running: abandoned, their leases will lapse",
                len(abandoned),
            )
        return StopReport(released=released, finished=finished, abandoned=len(abandoned))

    # -- claimer ----------------------------------------------------------------------------------

    def _claimer_ended(self) -> None:
        """From then on, every run writes its own settlement (none is left waiting); the
        connection the claimer kept goes back to the pool."""
        try:
            self._completer.close()
        finally:
            self._store.release_connection()

    def _claim_round(self) -> None:
        """One claim: wait for room, write gathered settlements, claim, hand over or release.

        The workers it claims for are reserved first (taken off ``_idle``) and given back when
        the claim returned fewer rows or failed, so concurrent claimers never count a worker
        twice. A failure is raised to the supervisor, which logs, counts and backs off.
        Hand-off keys taken for a failed claim stay claimable by the general claim.

        The general claim (any claimable row, handed off or not) runs again at once while the
        last one filled its batch, and a poll interval after one came back short, whatever the
        hand-off holds: retries come due, leases of crashed workers lapse, other replicas and
        redrives queue rows, and none of them may wait for the inbox to fall quiet. When it
        runs, it takes the hand-off keys' rows with the others, in its order (tenants in turn,
        priorities). Between its runs, hand-off keys are claimed by key when one round takes
        them all; more keys than a round takes are a backlog, whose order is the general
        claim's. Rows the inbox writes claimed never wait for it, so a claim of an empty queue
        at every settlement would cost a statement per commit and find nothing.
        """
        self._store.keep_connection()  # its round trips are the pool's pace: one warm backend
        with self._cond:
            self._await_work()
            if self._stopping.is_set():
                return
            self._gather_settlements()
            settling = self._completer.take()
            planned = self._plan(settling)
            if planned is None:
                return  # another claimer took what had gathered
            want, claiming, handoff = planned
            overflows = self._overflows
        claims: list[Claim] = []  # filled as they are handed over, for the count below
        full: bool | None = None  # whether a general claim ran and filled its batch
        try:
            sent_at = time.monotonic()  # leases start no earlier than this, by our clock
            full = self._claim(want if claiming else 0, handoff, settling, sent_at, claims)
        finally:
            with self._cond:
                self._reserved -= want
                self._idle += want - len(claims)
                if full is not None and overflows == self._overflows:
                    # Came back short: nothing more is claimable now; look again a poll
                    # interval later (hand-off keys and rows written claimed do not wait).
                    self._backlog = full
                    self._rescue_at = 0.0 if full else time.monotonic() + self._poll
                if len(claims) < want:
                    self._cond.notify_all()

    def _plan(self, settling: Batch | None) -> tuple[int, bool, dict[Key, str]] | None:
        """What a round claims, called holding the condition: how many rows (their slots
        reserved), whether it claims at all (else it only writes ``settling``), and the
        hand-off keys it claims by key (none: the general claim). None: nothing to do.

        Rows to claim: any claimable row when the general claim is due, or else the hand-off
        keys (no more slots than keys: the inbox writes new rows claimed into the slots left
        free), or else as many rows as these settlements may free (the next row of an ordered
        group, a slot under a limit), which the claim then sees in the same transaction.
        """
        frees = self._frees_rows(settling) if settling is not None else 0
        general = time.monotonic() >= self._rescue_at
        if general:
            need = self._slots
        elif self._handoff:
            need = len(self._handoff)
            if frees:
                self._rescue_at = 0.0  # the next round claims what these freed
        else:
            need = frees  # at most a row each: in their own slots, the free ones left
        if settling is not None:
            # Their workers are free once this write commits: claim for them with it.
            extra = min(self._idle, max(need - len(settling), 0))
            want = len(settling) + extra  # in statements of at most claim_batch rows
        else:
            extra = want = min(self._idle, need, self._claim_batch)
            if want == 0:
                return None
        self._idle -= extra
        self._reserved += want
        claiming = need > 0
        if claiming and not general and len(self._handoff) > want:
            general = self._backlog = True  # keys left over: the general claim's order
        handoff: dict[Key, str] = {}
        if claiming:
            # The general claim takes the keys' rows (it runs until it comes back short, when
            # nothing claimable is left); else this round takes every key.
            if not general:
                handoff = self._handoff
            self._handoff = {}
        return want, claiming, handoff

    def _await_work(self) -> None:
        """Wait (holding the condition) until there is something to do: settlements to write,
        or a free slot and hand-off keys to claim, or a free slot and the general claim due."""
        while not self._stopping.is_set():
            if self._completer.pending:
                return
            if self._idle:
                if self._handoff:
                    return
                due = self._rescue_at - time.monotonic()
                if due <= 0:
                    return
                self._cond.wait(timeout=due)
            else:
                self._cond.wait()

    def _hand_over(self, claims: list[Claim], sent_at: float, handed: list[Claim]) -> None:
        """Queue claims for the workers (their slots already counted); once stopping, release
        them. Rows whose end may free another (of an ordered group, under a concurrency limit)
        are remembered until their runs end (:meth:`_ended`).

        The stop flag is read under the condition ``stop()`` sets it under, so a claim is either
        queued before the stop drains the queue, or released here: never stranded. Every claim
        is added to ``handed`` before anything can raise.
        """
        handed += claims
        error: Exception | None = None
        for claim in claims:
            try:
                self._events.claimed(claim)
            except Exception as exc:  # noqa: BLE001  (raised below, once every claim is placed)
                error = error or exc
        with self._cond:
            stopping = self._stopping.is_set()
            if not stopping:
                for claim in claims:
                    self._work.put((claim, sent_at))
                self._freeing.update(
                    claim.ticket
                    for claim in claims
                    if claim.ordering_key is not None
                    or self._store.claims.concurrency_limited(claim.job_type)
                )
            else:
                self._idle += len(claims)
        if stopping:
            released = sum(1 for claim in claims if self._release(claim))
            log.info("claimed while stopping: released %d of %d", released, len(claims))
        if error is not None:
            raise error

    def _gather_settlements(self) -> None:
        """Give the runs still going a moment to join the settlements already waiting.

        Without it every transaction would carry only the settlements that arrived during the
        previous one. It ends once this claimer's share of the workers (or every running one)
        has settled, once no settlement arrived for a quarter of the linger, and at
        ``settle_linger`` in any case. Called holding the condition.
        """
        if self._settle_linger <= 0:
            return
        deadline = time.monotonic() + self._settle_linger
        quiet = self._settle_linger / 4
        seen = -1
        while not self._stopping.is_set():
            pending = self._completer.pending
            running = self._slots - self._idle - self._reserved
            if pending == 0 or pending >= running or pending >= self._share or pending == seen:
                return
            seen = pending
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(timeout=min(left, quiet))

    def _claim(
        self,
        want: int,
        handoff: dict[Key, str],
        settling: Batch | None,
        sent_at: float,
        handed: list[Claim],
    ) -> bool | None:
        """Claim up to ``want`` rows and hand them over (into ``handed``); write ``settling`` in
        the transaction of the first claim. Returns whether a general claim ran and filled its
        batch (None: it did not run, the keys were claimed or nothing).

        One transaction, one commit, for the settlements and the rows that refill the workers
        they free, so the rows held never exceed the threads, and the claim sees what the
        settlements freed (measured: docs/benchmarks.md, "Worker tier"). Each row moves under
        its own fence, inside its statement; nothing is decided by their order. The batch's
        runs are answered once the rows are handed over, each with a row claimed for it to run
        next where there is one. A write that failed, or whose commit is in doubt, answers them
        with its error and the rows go to the queue; a claim that failed had the settlements
        written alone, and its error is raised once they are answered.
        """
        claiming = _ClaimRound(self._store, self.worker_id, settling)
        claims: list[Claim] = []  # grows statement by statement: kept when a later one fails
        error: BaseException | None = None
        full: bool | None = None
        try:
            full = self._claim_rows(want, handoff, claiming, claims)
            claiming.finish()
        except BaseException as exc:  # noqa: BLE001  (raised below, once every claim is placed)
            claiming.failed(exc)
            error = exc
        try:
            self._hand_over(claims, sent_at, handed)
        finally:
            claiming.answer()
        if error is not None:
            raise error
        return full

    def _claim_rows(
        self, want: int, handoff: dict[Key, str], claiming: _ClaimRound, claims: list[Claim]
    ) -> bool | None:
        """Up to ``want`` rows into ``claims``: the handed-off keys, or else claimable rows of the
        job types this pool runs, in statements of at most ``claim_batch`` rows. Whether the
        general claim filled its batch (None: it did not run)."""
        by_lease: dict[timedelta, list[Key]] = defaultdict(list)
        for key, job_type in handoff.items():
            by_lease[self._registry[job_type].lease].append(key)
        for lease, keys in by_lease.items():
            claims += claiming.claim(lease, keys=keys)
        if handoff or want == 0:
            return None
        groups: dict[timedelta, list[str]] = defaultdict(list)
        for spec in self._registry.specs():
            groups[spec.lease].append(spec.job_type)
        for lease, job_types in groups.items():
            while (room := want - len(claims)) > 0:
                asked = min(room, self._claim_batch)
                got = claiming.claim(lease, limit=asked, job_types=job_types)
                claims += got
                if len(got) < asked:
                    break  # none left of these job types
        return len(claims) >= want

    # -- workers ----------------------------------------------------------------------------------

    def _work_round(self, done: threading.Event) -> None:
        """Run claims while they come within a round; ``None`` ends this worker.

        A round goes on with the next claim without a new pass through the supervisor, so
        its bookkeeping is paid once per round, not once per run.
        """
        deadline = time.monotonic() + WORKER_ROUND_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._work.get(timeout=left)
            except queue.Empty:
                return
            if item is None:
                done.set()
                return
            # An executor bug reaches the supervisor (logged by type, counted); the row's lease
            # will lapse and the next claim reconciles.
            self._run(*item)

    def _free(self, slots: int) -> None:
        with self._cond:
            self._idle += slots
            self._cond.notify_all()

    def _frees_rows(self, settling: Batch) -> int:
        """How many rows of a batch may each free another (the next row of its ordered group,
        a slot under its concurrency limit); called holding the condition. The claim written
        with the batch sees what they freed, so their runs' ends need not make the general
        claim due again."""
        found = 0
        for settlement in settling.settlements:
            if settlement.ticket in self._freeing:
                self._freeing.discard(settlement.ticket)
                found += 1
        return found

    def _ended(self, claim: Claim) -> None:
        """A run is over (or its row given back): if its row was of an ordered group or under
        a concurrency limit, and no batch's claim has seen its end yet (a settlement written
        alone, class A's own, a release), the general claim is due again."""
        with self._cond:
            if claim.ticket in self._freeing:
                self._freeing.discard(claim.ticket)
                self._rescue_at = 0.0
                self._cond.notify_all()  # a claimer waiting for the claim to come due

    def _run(self, claim: Claim, sent_at: float) -> None:
        """Run one claim. A run that handed its settlement over ends here for this thread, and
        for the pool when the answer comes (:class:`_RunEnd`); any other ends now."""
        spec = self._registry.get(claim.job_type)
        if spec is None or self._stopping.is_set():
            self._release(claim)
            self._ended(claim)
            self._free(1)
            return
        if time.monotonic() >= sent_at + spec.lease.total_seconds():
            # Its lease ran out while it waited for a thread (a prefetched claim behind slow
            # handlers): another worker may own the row by now. Given back, never run.
            self._release(claim)
            self._ended(claim)
            self._free(1)
            return
        ctx = Context.for_claim(claim, self._hasher)
        # The trust window is measured from before the claim statement was sent: it errs early.
        # A class A run is ended by its deadline, not its lease: it is stuck only past both.
        handler = spec.handler
        bound = handler.deadline if isinstance(handler, SameDatabaseHandler) else None
        entry = self.heartbeater.track(claim, ctx, spec.lease, sent_at, bound=bound)
        run_events = _RunEvents(self._events)
        span = self._telemetry.begin(claim) if self._telemetry is not None else None
        end = _RunEnd(self, claim, sent_at, entry, run_events, span)
        # Class A settles inside its own transaction; none of its writes is batched.
        settler = (
            RunSettler(self._completer, end.answered)
            if spec.target_class is not TargetClass.A
            else None
        )
        end.settler = settler
        try:
            with end.current(record=True):
                execute(
                    Run(
                        self._store.settle,
                        claim,
                        spec,
                        ctx,
                        run_events,
                        settler,
                        standby=self._standby,
                    )
                )
        finally:
            entry.running = False  # its thread is free; a stuck run is one still on its thread
            if settler is None or not settler.submitted:
                end.finish()

    def _release(self, claim: Claim) -> bool:
        try:
            self._store.settle.release(claim.ticket)
        except LeaseLost:
            return False
        except StoreUnavailable:
            return False  # its lease will lapse; the next claim takes it over
        return True


class _RunEnd:
    """What ends a run for the pool: untracked from the heartbeater, a refused renewal reported
    if the run did not conclude by itself, its claim-to-settle time, its span ended, its slot
    freed (unless the writer of its settlement counted it free already). Once, either when the
    run returns or, for a settlement it handed over, when the answer comes, in the thread that
    wrote it."""

    __slots__ = ("_done", "_entry", "_events", "_pool", "_sent_at", "_span", "claim", "settler")

    def __init__(  # noqa: PLR0917
        self,
        pool: WorkerPool,
        claim: Claim,
        sent_at: float,
        entry: InFlight,
        events: _RunEvents,
        span: Span | None,
    ) -> None:
        self._pool = pool
        self.claim = claim
        self._sent_at = sent_at
        self._entry = entry
        self._events = events
        self._span = span
        self.settler: RunSettler | None = None
        self._done = False

    def current(self, *, record: bool = False) -> AbstractContextManager[object]:
        """The run's span made current (where its events are reported), if it has one."""
        if self._span is None:
            return nullcontext()
        return trace.use_span(
            self._span,
            end_on_exit=False,
            record_exception=record,
            set_status_on_exception=record,
        )

    def answered(self, reaction: Answer, error: BaseException | None) -> None:
        """The settlement's answer: the run's reaction (its events), then its end."""
        try:
            with self.current():
                reaction(error)
        except Exception as exc:  # noqa: BLE001  (reported by type: the writer goes on)
            if exc is error:
                log.error(
                    "a run's settlement was not written: %s; the row's lease will lapse and "
                    "the next claim reconciles",
                    type(exc).__name__,
                )
            else:
                log.error("a run's settlement could not be reported: %s", type(exc).__name__)
        finally:
            self.finish()

    def finish(self) -> None:
        if self._done:
            return
        self._done = True
        pool, claim = self._pool, self.claim
        try:
            pool.heartbeater.untrack(claim)
            if self._entry.renewal_refused and not self._events.concluded:
                with self.current():
                    self._events.lease_lost(claim, "heartbeat")
            if pool._telemetry is not None:
                pool._telemetry.run_finished(claim, time.monotonic() - self._sent_at)
        finally:
            if self._span is not None:
                self._span.end()
            # The settler holds this end's ``answered``: a reference cycle that only the
            # cyclic collector would free, with the run's claim, context and heartbeat entry
            # in it. Dropped here, a run's objects go as its last reference does, and the
            # collector is not made to run every few dozen runs (docs/benchmarks.md, "Inbox
            # to settle, end to end").
            settler, self.settler = self.settler, None
            pool._ended(claim)
            if settler is None or not settler.taken:
                pool._free(1)  # else the writer of its settlement counted it free already


class _ClaimRound:
    """The claim statements of one round; the first carries the round's settlement batch.

    :meth:`finish` writes the batch alone when no claim statement ran; :meth:`failed` answers
    its runs with an error when it was not written; :meth:`answer` answers them once it was.
    """

    def __init__(self, store: PostgresStore, worker: str, settling: Batch | None) -> None:
        self._store = store
        self._worker = worker
        self._settling = settling
        #: the batch's stale tickets once it was written
        self._stale: list[Ticket] | None = None

    def claim(
        self,
        lease: timedelta,
        *,
        limit: int = 0,
        keys: list[Key] | None = None,
        job_types: list[str] | None = None,
    ) -> list[Claim]:
        store, worker = self._store, self._worker
        if self._settling is None or self._stale is not None:
            if keys:
                return store.claims.claim_keys(worker, keys, lease)
            return store.claims.claim(worker, limit, lease, job_types=job_types)
        done = store.claims.settle_and_claim(
            self._settling.settlements, worker, lease, limit=limit, keys=keys, job_types=job_types
        )
        self._stale = done.stale
        if done.claim_error is not None:
            raise done.claim_error
        return done.claims

    def finish(self) -> None:
        if self._settling is not None and self._stale is None:
            self._stale = self._store.settle.settle_many(self._settling.settlements)

    def failed(self, exc: BaseException) -> None:
        if self._settling is not None and self._stale is None:
            self._settling.fail(exc)

    def answer(self) -> None:
        if self._settling is not None and self._stale is not None:
            self._settling.answer(self._stale)


class _RunEvents:
    """Passes one run's events on and remembers whether the run concluded by itself.

    A refused heartbeat is only worth reporting as a lost lease when the run did not settle or
    report a loss of its own: a renewal that crosses the run's own settlement is refused too.
    """

    def __init__(self, events: WorkEvents) -> None:
        self._events = events
        self.concluded = False

    def claimed(self, claim: Claim) -> None:
        self._events.claimed(claim)

    def settled(self, claim: Claim, state: State, code: str) -> None:
        self.concluded = True
        self._events.settled(claim, state, code)

    def lease_lost(self, claim: Claim, action: str) -> None:
        self.concluded = True
        self._events.lease_lost(claim, action)

    def fenced_out(self, claim: Claim) -> None:
        self.concluded = True
        self._events.fenced_out(claim)

    def reconciled(self, claim: Claim, finding: str) -> None:
        self._events.reconciled(claim, finding)

    def settle_unknown(self, claim: Claim, action: str) -> None:
        self.concluded = True
        self._events.settle_unknown(claim, action)

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        self._events.rate_wait_clamped(claim, asked)
