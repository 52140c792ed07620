"""The handler API: what a team writes for each job type, and the outcomes it may end in.

A handler declares its **target class** (where its side effect lands) by the base class it
extends; that choice decides which executor runs it and what fencebridge can honestly promise:

=====  ===========================  =====================================================
class  base class                   what the team implements
=====  ===========================  =====================================================
A      :class:`SameDatabaseHandler`  ``handle(ctx, tx)``: business write on ``tx``, the
                                     transaction that holds the work row under its fence
B      :class:`ConditionalWriteHandler`  ``handle(ctx)``: writes that carry ``ctx.fence`` into
                                     the target's own condition (see :mod:`bridge.targets`)
C      :class:`IdempotentApiHandler`  ``perform(ctx, key)`` and ``lookup(ctx, key)`` against an
                                     API with idempotency keys and a lookup by key
D      :class:`UnfencedHandler`       ``call(ctx)``: at most one call, ever
=====  ===========================  =====================================================

Every run ends in exactly one outcome. Returning (``None`` or a :class:`Success`) is success;
anything else is raised: :class:`TerminalFailure`, :class:`RetryLater`, :class:`RateLimited`,
:class:`Ambiguous`, :class:`Quarantine`. Any other exception is classified, never swallowed,
and *where* it was raised decides how:

* before the request can have left (class A and B handlers, which the fence protects; the
  ``validate`` step of classes C and D): by :func:`classify`, a documented table
  (:data:`DEFAULT_CLASSIFICATION`);
* once the executor has started the call (``perform`` of class C, ``call`` of class D): by
  :func:`classify_sent`. Only an explicit outcome counts there; anything else, a ``ValueError``
  from a reply that could not be parsed as much as a timeout, is :class:`Ambiguous` (class C
  looks the key up, class D parks ``unknown``). The one exception is the operation's own
  payload: an error that :meth:`Context.json` raised about it is classified by the table.
"""

from __future__ import annotations

import enum
import http.client
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from bridge.deadline import TransactionDeadline
from bridge.errors import DeadlineExceeded, LeaseLost
from bridge.identity import IdentityHasher
from bridge.outbox.publish import NO_OUTBOX, NoOutbox, Outbox
from bridge.types import TargetClass

if TYPE_CHECKING:
    from bridge.database import Connection
    from bridge.store.records import ParkedRow
    from bridge.types import Claim


# -- outcomes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Success:
    """The effect is confirmed under this claim's fence."""

    code: str = "ok"
    detail: str | None = None


class HandlerOutcome(Exception):  # noqa: N818  (control flow, not an error)
    """Raised by a handler to end its run in an outcome other than success."""

    kind: ClassVar[OutcomeKind]

    def __init__(self, code: str, detail: str | None = None) -> None:
        self.code = code
        self.detail = detail
        super().__init__(code if detail is None else f"{code}: {detail}")


class TerminalFailure(HandlerOutcome):
    """Confirmed failure that retrying cannot fix (validation rejected, permission denied)."""


class RetryLater(HandlerOutcome):
    """Nothing was applied and a later attempt may succeed (backoff from the retry policy).

    Only raise this when the attempt *confirmed* nothing happened; otherwise raise
    :class:`Ambiguous`.
    """

    def __init__(
        self, code: str = "retry", detail: str | None = None, *, delay: timedelta | None = None
    ) -> None:
        super().__init__(code, detail)
        self.delay = delay


#: the wait of a :class:`RateLimited` raised without one
RATE_LIMIT_WAIT_DEFAULT = timedelta(seconds=1)
#: the longest wait a :class:`RateLimited` holds its job type and tenant for, unless the job
#: type sets its own (``jobs.<name>.rate_limit_wait_max_seconds``): a longer ``Retry-After`` (a
#: provider's mistake, a daily quota, a date far ahead) is cut to it, and the next attempt asks
#: again, so no single answer can hold a tenant's work for hours
RATE_LIMIT_WAIT_MAX_DEFAULT = timedelta(minutes=15)


class RateLimited(HandlerOutcome):
    """The target refused the call for now (HTTP 429, a quota) before acting on it.

    The row goes back to the queue after ``retry_after`` without using up an attempt (the
    target's limit is not the operation's failure), and every row of the same job type and
    tenant waits as long: the limit belongs to the target, so its siblings would be refused
    too. The wait is capped by the job type's maximum (:data:`RATE_LIMIT_WAIT_MAX_DEFAULT`
    unless configured): a longer one is cut to it and counted. Raise it only when the target
    said so; a refusal that may have acted is :class:`Ambiguous`.
    """

    def __init__(
        self,
        code: str = "rate_limited",
        detail: str | None = None,
        *,
        retry_after: timedelta | float = RATE_LIMIT_WAIT_DEFAULT,
    ) -> None:
        super().__init__(code, detail)
        wait = retry_after if isinstance(retry_after, timedelta) else timedelta(seconds=retry_after)
        #: never negative: a wait in the past means "due now"
        self.retry_after = max(wait, timedelta(0))


class Ambiguous(HandlerOutcome):
    """The effect may or may not have happened (timeout, reset, 5xx after sending)."""


class Quarantine(HandlerOutcome):
    """The handler cannot interpret the payload with confidence; it will not guess."""


class OutcomeKind(enum.StrEnum):
    SUCCESS = "success"
    TERMINAL = "terminal"
    RETRY = "retry"
    RATE_LIMITED = "rate_limited"
    AMBIGUOUS = "ambiguous"
    QUARANTINE = "quarantine"


TerminalFailure.kind = OutcomeKind.TERMINAL
RetryLater.kind = OutcomeKind.RETRY
RateLimited.kind = OutcomeKind.RATE_LIMITED
Ambiguous.kind = OutcomeKind.AMBIGUOUS
Quarantine.kind = OutcomeKind.QUARANTINE


#: How an uncaught exception is classified, first match wins (``isinstance``). Anything not
#: listed is **ambiguous**: when a handler fails in a way nobody anticipated, nobody can say
#: whether its effect happened. Executors refine this by target class (class A rolls its
#: transaction back, so its ambiguous outcomes are known not to have applied), and classes C
#: and D use it only before their call starts (:func:`classify_sent` after).
DEFAULT_CLASSIFICATION: tuple[tuple[type[BaseException], OutcomeKind], ...] = (
    # The request never left: nothing can have been applied.
    (ConnectionRefusedError, OutcomeKind.RETRY),
    # The request may have been received and acted on before the connection broke.
    (TimeoutError, OutcomeKind.AMBIGUOUS),
    (ConnectionError, OutcomeKind.AMBIGUOUS),
    (http.client.HTTPException, OutcomeKind.AMBIGUOUS),
    # The input cannot be read: a person must look at it, not a retry loop.
    (UnicodeDecodeError, OutcomeKind.QUARANTINE),
    (json.JSONDecodeError, OutcomeKind.QUARANTINE),
    # Validation and programming errors on the input: retrying changes nothing.
    (ValueError, OutcomeKind.TERMINAL),
    (TypeError, OutcomeKind.TERMINAL),
    (LookupError, OutcomeKind.TERMINAL),
    (PermissionError, OutcomeKind.TERMINAL),
)


def classify(
    exc: BaseException,
    table: tuple[tuple[type[BaseException], OutcomeKind], ...] = DEFAULT_CLASSIFICATION,
) -> HandlerOutcome:
    """Turn any exception into an outcome, so nothing a handler raises is swallowed or lost."""
    if isinstance(exc, HandlerOutcome):
        return exc
    code = type(exc).__name__
    for kind_type, kind in table:
        if isinstance(exc, kind_type):
            return _outcome(kind, code)
    return Ambiguous(code, "unclassified exception")


#: the detail of an exception turned ambiguous because the call had started when it was raised
SENT_DETAIL = "raised after the request may have been sent"


def classify_sent(exc: BaseException, ctx: Context) -> HandlerOutcome:
    """Classify an exception raised once the call to a class C or D target has started.

    The request may have reached the target by then, so nothing short of an explicit
    outcome can say it did not act: a client that got a 200 and failed to read it raises a
    ``ValueError`` or a ``KeyError``, and calling that a failure would invite a second effect.
    Only errors about the operation's own payload (raised by :meth:`Context.json`) keep their
    place in the table: they describe the input, not an answer from the target.
    """
    if isinstance(exc, HandlerOutcome):
        return exc
    if ctx.unreadable_payload is not None and exc is ctx.unreadable_payload:
        return classify(exc)
    return Ambiguous(type(exc).__name__, SENT_DETAIL)


def _outcome(kind: OutcomeKind, code: str) -> HandlerOutcome:
    match kind:
        case OutcomeKind.TERMINAL:
            return TerminalFailure(code)
        case OutcomeKind.RETRY:
            return RetryLater(code)
        case OutcomeKind.QUARANTINE:
            return Quarantine(code)
        case _:
            return Ambiguous(code)


# -- context -------------------------------------------------------------------------------------


class LeaseFlag:
    """A :class:`threading.Event` (``set``, ``is_set``, ``wait``, ``clear``) that costs a plain
    flag until somebody waits on it: every run has one, and almost no run ever waits on it."""

    __slots__ = ("_event", "_flag")

    #: guards the creation of a waited-on flag's event (rare: a lock for all of them)
    _creating: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        event = self._event  # a waiter made it before it read the flag, or reads it after
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._flag = False
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        event = self._event
        if event is None:
            with LeaseFlag._creating:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        if self._flag:  # set before the event existed
            event.set()
        return event.wait(timeout)


@dataclass(kw_only=True)
class Context:
    """What a handler knows about the run it is in.

    ``progress()`` is how a handler keeps its lease: the runtime renews a lease only if the
    handler reported progress since the last renewal. A handler that stops reporting loses the
    lease, and the fence protects whoever takes over. ``progress()`` raises
    :class:`~bridge.errors.LeaseLost` once the lease is gone, so a handler learns it at its next
    step instead of carrying on.
    """

    tenant_id: str
    operation_id: str
    job_type: str
    subscription: str
    attempt: int
    max_attempts: int
    fence: int
    payload: bytes
    schema_version: str | None = None
    #: derives :attr:`idempotency_key` the first time it is read: an HMAC that most runs (every
    #: class A and B run) never need
    derive_idempotency_key: Callable[[], str] | None = field(default=None, repr=False)
    #: set once the run's lease is gone (a refused write or renewal, an abandoned run)
    lease_lost: LeaseFlag = field(default_factory=LeaseFlag)
    #: where a class A handler publishes messages, in its fenced transaction
    #: (:mod:`bridge.outbox.publish`); outside one, publishing raises
    outbox: Outbox | NoOutbox = field(default=NO_OUTBOX, repr=False)
    #: the error :meth:`json` raised about this operation's payload, if it raised one
    unreadable_payload: ValueError | None = field(default=None, repr=False)
    #: progress reported since the heartbeat last took it (a flag: one writer sets it, the
    #: heartbeat reads and clears it; a report between the two is one the read already saw)
    _progress: bool = field(default=False, repr=False)
    _on_progress: Callable[[], None] | None = field(default=None, repr=False)
    #: true while a class A transaction holds the work row's lock (under ``_row_deadline``)
    _holding_row: bool = field(default=False, repr=False)
    _row_deadline: TransactionDeadline | None = field(default=None, repr=False)

    @classmethod
    def for_claim(cls, claim: Claim | ParkedRow, hasher: IdentityHasher) -> Context:
        """The context of one run of ``claim``: its fence, attempt, payload and key. A parked
        row stands for its last claim (a redrive's lookup runs under that claim's fence)."""
        key = claim.key
        return cls(
            tenant_id=key.tenant_id,
            operation_id=key.operation_id,
            job_type=claim.job_type,
            subscription=claim.subscription,
            attempt=claim.attempts,
            max_attempts=claim.max_attempts,
            fence=claim.fence,
            payload=claim.payload or b"",
            schema_version=claim.schema_version,
            # under the key the row was written with, not necessarily the current one
            derive_idempotency_key=hasher.idempotency_key_deriver(
                key.tenant_id, key.operation_id, claim.identity_key_id
            ),
        )

    @cached_property
    def idempotency_key(self) -> str:
        """The tenant-scoped, opaque idempotency key for class C targets (see
        :meth:`bridge.identity.IdentityHasher.idempotency_key`); empty when none was given."""
        derive = self.derive_idempotency_key
        return derive() if derive is not None else ""

    def progress(self) -> None:
        """Report that the work is advancing (renews the lease at the next heartbeat).

        While a class A handler holds its work row's lock, nothing can take the row over, so
        its lease is not what ends it: ``progress()`` then never raises for lease reasons, and
        raises :class:`~bridge.deadline.DeadlineExceeded` once the transaction's deadline has
        passed (the transaction will roll back; stopping early frees the row sooner).
        """
        if self._holding_row:
            deadline = self._row_deadline
            if deadline is not None and deadline.expired:
                raise DeadlineExceeded(deadline.deadline)
        elif self.lease_lost.is_set():
            raise LeaseLost(self.tenant_id, self.operation_id, self.fence, "progress")
        self._progress = True
        if self._on_progress is not None:
            self._on_progress()

    @contextmanager
    def holding_row(self, deadline: TransactionDeadline | None) -> Iterator[None]:
        """For the class A executor: the handler runs holding its row's lock, under this
        deadline (None: no deadline, and progress never raises for the lease either)."""
        self._holding_row, self._row_deadline = True, deadline
        try:
            yield
        finally:
            self._holding_row, self._row_deadline = False, None

    def take_progress(self) -> bool:
        """For the heartbeat: did the handler report progress since the last call?"""
        if self._progress:
            self._progress = False
            return True
        return False

    def restore_progress(self) -> None:
        """For the heartbeat: a renewal failed, so keep the progress for the next round."""
        self._progress = True

    def json(self) -> Any:
        """The payload parsed as JSON (a decoding error is classified as quarantine, even
        when raised after a call started: it is about the input, not the target's answer)."""
        try:
            return json.loads(self.payload)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            self.unreadable_payload = exc
            raise


# -- handlers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded attempts and exponential backoff with full jitter between them."""

    max_attempts: int = 5
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)


class Handler(ABC):
    """Common base; extend one of the four target-class bases below, not this one."""

    target_class: ClassVar[TargetClass]
    #: the honest guarantee of this target class, shown by ``fencebridge check``
    guarantee: ClassVar[str]


#: the deadline of a class A transaction unless its handler declares its own
DEADLINE_DEFAULT = timedelta(seconds=30)


class SameDatabaseHandler(Handler):
    """Class A: the side effect is a write in the same PostgreSQL database as the work table.

    The executor opens the transaction, locks the work row under the fence, calls
    :meth:`handle` with that transaction's connection, marks the work row and commits once.
    A stale worker cannot commit its business write.

    While the lock is held nothing can take the row over, so ``ctx.progress()`` never raises
    for lease reasons here; the run is bounded by :attr:`deadline` instead.
    """

    target_class = TargetClass.A
    guarantee = "a stale worker cannot commit its business write (same transaction as the fence)"
    #: how long the transaction may hold the work row's lock: past it, the transaction is
    #: cancelled and rolled back (nothing applied) and the run is retried. The lease does not
    #: end a class A run, so this does. Override it per handler class or instance.
    deadline: timedelta = DEADLINE_DEFAULT

    @abstractmethod
    def handle(self, ctx: Context, tx: Connection) -> Success | None: ...


class ConditionalWriteHandler(Handler):
    """Class B: the target store keeps the last fence and refuses writes that carry a lower one.

    Write through the helpers in :mod:`bridge.targets` (or your store's own conditional write
    with ``ctx.fence`` in the condition). A refused condition raises
    :class:`~bridge.errors.FencedOut`: the write was fenced out and is never retried. Writes
    must set state (not increment it), so a takeover under a higher fence that repeats the
    write leaves the same result.
    """

    target_class = TargetClass.B
    guarantee = "writes carrying a lower fence are rejected by the target store itself"

    @abstractmethod
    def handle(self, ctx: Context) -> Success | None: ...


@dataclass(frozen=True, slots=True)
class Applied:
    """A lookup found the effect under this idempotency key."""

    code: str = "ok"
    detail: str | None = None


class NotApplied:
    """A lookup confirmed the provider has nothing under this idempotency key."""


class CannotTell(Exception):  # noqa: N818
    """A lookup could not determine whether the effect happened."""


class IdempotentApiHandler(Handler):
    """Class C: an external API with an idempotency key and a lookup by that key.

    This is **dedupe, not fencing**: the provider, not fencebridge, decides what a repeated key
    means, for as long as the provider retains keys. The executor looks up first on every
    claim after the first attempt and after every ambiguous outcome: applied means succeeded
    (no second call), confirmed-not-applied means perform under the new fence, and a lookup
    that cannot tell parks the operation as ``unknown`` once an attempt may have reached the
    provider (the executor records the intent before :meth:`perform`; without one, nothing
    was sent and it performs). A lookup that raises :class:`Quarantine` quarantines the row
    when no attempt recorded an intent, and parks it ``unknown`` when one did.

    :meth:`validate` runs before :meth:`perform` and is the place for every check that can
    fail before a request is sent: what it raises is classified by the table. Once
    :meth:`perform` is entered the request may leave at any moment, so anything it raises that
    is not an explicit outcome is ambiguous and the key is looked up.
    """

    target_class = TargetClass.C
    guarantee = (
        "duplicates are deduplicated by the provider's idempotency key, as the provider "
        "defines it (dedupe, not fencing)"
    )

    def validate(self, ctx: Context) -> None:
        """Check the payload before anything is sent; raise an outcome to stop here.

        Anything raised here is classified normally: the provider has not been called yet.
        """

    @abstractmethod
    def perform(self, ctx: Context, key: str) -> Success | None: ...

    @abstractmethod
    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        """Ask the provider; raise :class:`CannotTell` when it cannot say."""


class UnfencedHandler(Handler):
    """Class D: a target with neither fencing nor idempotency nor lookup.

    At most one call, ever: the intent is recorded under the fence before :meth:`call`, and any
    later claim that finds the intent parks the operation as ``unknown`` instead of calling
    again. Exactly-once cannot be claimed for this class.
    """

    target_class = TargetClass.D
    guarantee = "at most one call; an ambiguous result is parked as unknown, never repeated"

    def validate(self, ctx: Context) -> None:
        """Check the payload before the intent is recorded; raise an outcome to stop here.

        Anything raised here is classified normally: the target has not been called yet. Once
        :meth:`call` is entered, anything but an explicit outcome is ambiguous: ``unknown``.
        """

    @abstractmethod
    def call(self, ctx: Context) -> Success | None: ...
