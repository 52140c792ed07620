"""SQS consumer: long-poll, one inbox transaction per received batch, then delete.

``after_inbox`` (default): every delivery the database now holds (new, replay, conflict,
quarantined) is deleted with ``DeleteMessageBatch`` right after COMMIT; the broker was only a
wake-up signal. If the transaction fails nothing is deleted, and the messages come back when
their visibility timeout ends. A delete that fails as a whole is retried (jittered backoff)
while the copy's visibility lasts; past that it comes back as a replay.

``after_outcome``: deliveries with a work row are held by a
:class:`~bridge.adapters.holding.Holder`, which keeps each copy's visibility deadline, measured from
the answer of the receive that returned it. It extends a copy whose row is queued or whose claim's
lease is live (renewed by handler progress) once that copy's own deadline comes near, deletes it as
soon as its row is terminal or parked, and lets go of it when its claim stalled, so SQS redelivers
it (a replay). Deletes and extensions run on the holder's call threads: one slow call delays only
its own batch. An extension SQS refuses (``ReceiptHandleIsInvalid``: a later receive replaced the
handle; ``MessageNotInflight``: the visibility ran out) is a lost broker lease: the handle is
dropped and counted, nothing crashes. Visibility is never extended past twelve hours from the
receive (the SQS limit); the message is then left to return.

Stopping: messages a receive returns after the stop began are not written; they are handed back
at once (visibility 0), and so is every held delivery, so another replica takes them without
waiting out their visibility. A batch whose write is under way is written and deleted first.

The receive loop never dies: a failure is logged (by type, or by the project's own error text),
counted, reported by :meth:`SqsConsumer.status` and retried with tenacity's jittered
exponential backoff, capped at ten seconds.

Counters (:attr:`SqsConsumer.counts`): ``received``, ``decision.<decision>``, ``deleted``,
``delete_failed`` and ``delete_failed.<reason>`` (an SQS error code, or ``unanswered``: never
confirmed while the copy was leased), ``extended``, ``broker_lease_lost`` and
``broker_lease_lost.<code>``, ``let_go``, ``released`` (held copies handed back on stop),
``handed_back`` (received, never written, handed back on stop), ``held`` (now),
``deferred_quota`` (left in the queue by the tenant backlog quota), ``receive_failed`` and
``call_failed.<reason>`` (broker calls that failed as a whole and were retried).

Tenant backlog quota (``tenant_backlog_quota``): a delivery the inbox defers because its
tenant's open backlog is at the quota is neither deleted nor held. It stays in the queue and
comes back once the visibility timeout of its receive (``visibility_timeout_seconds``) runs out,
or, with ``quota_backoff_seconds``, after that long (``ChangeMessageVisibilityBatch``, retried
briefly; ``deferred_backoff_failed`` counts copies left at their receive's timeout). Each return
adds to the message's receive count, which a redrive policy's ``maxReceiveCount`` also counts.

FIFO queues: the message group becomes the row's ordering key, so a group's next row is not
claimed before the previous one settles. ``ApproximateReceiveCount`` is recorded on the row.
Binary message attributes are not used for decoding.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field, StrictInt, StrictStr, WithJsonSchema
from tenacity import wait_random_exponential

from bridge.adapters.kit import (
    IDLE,
    Backoff,
    BrokerExpectations,
    BrokerFinding,
    CallResult,
    Deadline,
    Deferred,
    Holder,
    HttpUrl,
    Inbox,
    ProbedAcks,
    RowWatch,
    Service,
    Shown,
    SourceAdapter,
    SourceSettings,
    SubscriptionConfig,
    Written,
    checked,
    confirm,
    producer_traceparent,
    shown,
    stream_status,
)
from bridge.errors import BrokerUnavailable
from bridge.types import Key, RawDelivery

log = logging.getLogger(__name__)

RECEIVE_BATCH_DEFAULT: Final = 10
WAIT_SECONDS_DEFAULT: Final = 20
VISIBILITY_TIMEOUT_DEFAULT: Final = 60
CONSUMERS_DEFAULT: Final = 1
#: SQS keeps a message at most 14 days (``MessageRetentionPeriod``)
REDELIVERY_DAYS: Final = 14
MAX_VISIBILITY_SECONDS = 12 * 3600
#: SQS batch calls carry ten entries at most
MAX_BATCH: Final = 10
_LEASE_LOST_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "InvalidParameterValue",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)
#: the receive loop's pause after a failure grows from this (seconds, full jitter) ...
BACKOFF_INITIAL: Final = 0.2
#: ... up to this
BACKOFF_MAX: Final = 10.0
#: the holder's threads for deletes and extensions: SQS calls are short but many (ten copies
#: each), and one slow call must not hold up the extensions queued behind it
HOLD_CALL_THREADS: Final = 8
#: connect and read timeout of a delete or visibility change (seconds): a call that hangs is
#: given up and tried again while its copies are leased; the broker may have applied it, and
#: both calls are safe to repeat
CALL_TIMEOUT_SECONDS: Final = 10.0
#: a receive round running this much longer than its long poll is reported as stalled
_STALL_MARGIN = 120.0
#: what a hand-back on stop may spend retrying a failed call
_HAND_BACK_SECONDS = 2.0
#: an after_inbox delete stops retrying this long before the copy's visibility ends
_DELETE_MARGIN = 0.5


def receive_backoff() -> wait_random_exponential:
    """The receive loop's pause before its n-th retry: full jitter, exponential, capped."""
    wait = Backoff(initial=BACKOFF_INITIAL, cap=BACKOFF_MAX).wait()
    assert isinstance(wait, wait_random_exponential)
    return wait


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery kept in flight until its work row's outcome (after_outcome)."""

    key: Key
    #: the receipt handle of this copy
    handle: str
    #: monotonic time of the receive's answer
    received_at: float


def to_raw(subscription: str, message: dict[str, Any]) -> RawDelivery:
    """An SQS message as a broker-neutral delivery."""
    attributes = {
        name: value["StringValue"]
        for name, value in message.get("MessageAttributes", {}).items()
        if isinstance(value, dict) and isinstance(value.get("StringValue"), str)
    }
    system = message.get("Attributes", {})
    try:
        count: int | None = int(system["ApproximateReceiveCount"])
    except (KeyError, TypeError, ValueError):
        count = None
    return RawDelivery(
        subscription=subscription,
        message_id=message.get("MessageId"),
        # A lone surrogate (SQS refuses them, a local server may not) is kept, not fatal: the
        # bytes are then not UTF-8, and the decoder quarantines or hashes them as they are.
        body=str(message.get("Body", "")).encode("utf-8", "surrogatepass"),
        attributes=attributes,
        receive_count=count,
        ordering_key=system.get("MessageGroupId"),
        trace_context=producer_traceparent(attributes, system.get("AWSTraceHeader")),
    )


class SqsConsumer:
    """Receives one queue for one subscription. Thread-safe start/stop; never dies silently."""

    def __init__(
        self,
        client: Any,
        queue_url: str,
        subscription: str,
        inbox: Inbox,
        *,
        store: RowWatch | None = None,
        ack_mode: str = "after_inbox",
        receive_batch: int = RECEIVE_BATCH_DEFAULT,
        wait_seconds: int = WAIT_SECONDS_DEFAULT,
        visibility_timeout: int = VISIBILITY_TIMEOUT_DEFAULT,
        threads: int = 1,
        tenant_backlog_quota: int | None = None,
        quota_backoff_seconds: int | None = None,
        calls_client: Any = None,
    ) -> None:
        """``calls_client`` makes the deletes and visibility changes (``client`` when None): one
        that does not retry on its own, since those calls are retried within the copy's
        deadline by :func:`~bridge.adapters.holding.confirm`."""
        if ack_mode not in ("after_inbox", "after_outcome"):
            raise ValueError(f"unknown ack mode {ack_mode!r}")
        if tenant_backlog_quota is not None and tenant_backlog_quota < 1:
            raise ValueError("tenant_backlog_quota is a number of rows, at least 1 (None: none)")
        if quota_backoff_seconds is not None and not 0 <= quota_backoff_seconds <= (
            MAX_VISIBILITY_SECONDS
        ):
            raise ValueError("quota_backoff_seconds is a visibility timeout, 0..43200 seconds")
        self._quota = tenant_backlog_quota
        self._quota_backoff = quota_backoff_seconds
        if ack_mode == "after_outcome" and store is None:
            raise ValueError("after_outcome needs the store to watch work rows")
        self._client = client
        self._queue_url = queue_url
        self.subscription = subscription
        self._inbox = inbox
        self._ack_mode = ack_mode
        self._batch = receive_batch
        self._wait = wait_seconds
        self._visibility = visibility_timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: set once held deliveries are released: a batch written after that is handed back
        self._closed = False
        self._counts: Counter[str] = Counter()
        self._calls = QueueCalls(
            client if calls_client is None else calls_client,
            queue_url,
            subscription,
            inbox,
            self._count,
        )
        self._holder: Holder[Held] | None = None
        if ack_mode == "after_outcome":
            assert store is not None
            self._holder = Holder(
                f"sqs-{subscription}",
                store,
                self._calls,
                extension=visibility_timeout,
                limit=MAX_VISIBILITY_SECONDS - 60,  # SQS counts twelve hours from the receive
                call_threads=HOLD_CALL_THREADS,
                supervise=inbox.supervised,
            )
        # Each receiver is a supervised loop: a failed round is logged by type, counted (here
        # and in fencebridge.thread.restarts), backed off with jitter and run again; a round
        # that outlasts its long poll and write by far marks the subscription not ready.
        self._receivers = [
            inbox.supervised(
                f"sqs:{subscription}:receive-{i}",
                self._turn,
                label="sqs_receiver",
                stop=self._stop,
                backoff=Backoff(initial=BACKOFF_INITIAL, cap=BACKOFF_MAX),
                stall_after=wait_seconds + _STALL_MARGIN,
                idle_clears_after=visibility_timeout + wait_seconds + 1,
                thread_name=f"sqs-{subscription}-{i}",
            )
            for i in range(threads)
        ]
        # The inbox reports these counts as metrics (deletes, extensions, lost leases...).
        self._inbox.observe_stream(subscription, lambda: self.counts)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._holder is not None:
            self._holder.start()
        for receiver in self._receivers:
            receiver.start()

    def stop(self, deadline: float = 30.0) -> None:
        """Stop receiving; hand back what was not written, delete what was, release what is held.

        A batch being written when the stop begins is written and deleted (or held, then
        released). Messages a receive returns after it are handed back at once, unwritten.
        """
        end = time.monotonic() + deadline
        self._stop.set()
        # Held copies go back first, then the receivers are waited for. A receive still
        # long-polling returns what the release made visible at once, and its receiver hands it
        # back. The other order let a receive that outlasted its share of the deadline take the
        # released copies after this process had gone: invisible for a whole visibility timeout.
        with self._lock:
            self._closed = True  # a batch written from now on is handed back, not held
        if self._holder is not None:
            self._holder.stop(max(end - time.monotonic() - _HAND_BACK_SECONDS, 0.5))
        late = sum(
            not receiver.join(Deadline(max(end - time.monotonic(), 0)))
            for receiver in self._receivers
        )
        if late:
            # What such a receive returns after this process exits stays invisible until its
            # visibility timeout ends: a shutdown deadline longer than the long poll avoids it.
            log.warning(
                "%s: %d receive(s) still outstanding at the shutdown deadline; what they return"
                " comes back after its visibility timeout",
                self.subscription,
                late,
            )

    def status(self) -> tuple[bool, str]:
        """Ready, and why not."""
        if self._stop.is_set():
            return True, "stopping"
        return stream_status(
            self.subscription,
            self._receivers,
            None,
            holder=self._holder,
            counts=self.counts,
            shown=STREAM_COUNTS,
        )

    @property
    def counts(self) -> Counter[str]:
        """What happened on this subscription so far, by event (a copy)."""
        with self._lock:
            counts = Counter(self._counts)
        if self._holder is not None:
            theirs = Counter(dict(self._holder.counts))
            for name in _HOLDER_COUNTS:
                counts[name] += theirs[name]
            # A delete left unconfirmed keeps its copy held and is tried again next round.
            counts["delete_retried"] += theirs["settle_retried"]
            counts["held"] = len(self._holder)
        return +counts

    def held(self) -> int:
        """Deliveries held now (after_outcome)."""
        return len(self._holder) if self._holder is not None else 0

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    # -- receiving --------------------------------------------------------------------------------

    def _receive(self) -> tuple[list[dict[str, Any]], float]:
        """One receive: its messages and the monotonic time of its answer."""
        try:
            response = self._client.receive_message(
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=self._batch,
                WaitTimeSeconds=self._wait,
                # The visibility this consumer is configured for, not the queue's default: an
                # after_outcome hold counts each copy's deadline from it.
                VisibilityTimeout=self._visibility,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        except (BotoCoreError, ClientError) as exc:
            raise BrokerUnavailable(
                f"receive from SQS queue {self._queue_url} failed: {_describe(exc)}"
            ) from exc
        answered = time.monotonic()
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages, answered

    def services(self) -> list[Service]:
        """Its supervised loops, for ``/healthz`` and ``/readyz``."""
        holder = [self._holder.service] if self._holder is not None else []
        return [*self._receivers, *holder]

    def _turn(self) -> str | None:
        """Receive once and write what came; raises on any failure, for the supervisor.

        An empty receive is :data:`~bridge.service.IDLE`: after a failed write, the failed
        messages are invisible for a visibility timeout, and the empty polls meanwhile do not
        show that writing works again.
        """
        try:
            messages, answered = self._receive()
            if not messages:
                return IDLE
            if self._stop.is_set():
                self._hand_back(messages, "handed_back")
            else:
                self._process(messages, answered)
        except Exception:
            self._count("receive_failed")
            raise
        return None

    def _process(self, messages: list[dict[str, Any]], received_at: float) -> None:
        self._count("received", len(messages))
        raws = [to_raw(self.subscription, m) for m in messages]
        # Raises when the transaction did not commit: nothing is deleted below.
        outcomes = self._inbox.admit(raws, quota=self._quota)
        # A delivery deferred by the tenant backlog quota is left in the queue, untouched: it
        # comes back when the visibility timeout of its receive runs out.
        deferred = [o for o in outcomes if isinstance(o, Deferred)]
        for d in deferred:
            self._count(f"deferred_{d.reason}")
        if deferred and self._quota_backoff is not None:
            self._back_off(
                [m for m, o in zip(messages, outcomes, strict=True) if isinstance(o, Deferred)]
            )
        kept = [(m, o) for m, o in zip(messages, outcomes, strict=True) if isinstance(o, Written)]
        messages = [m for m, _ in kept]
        written = [w for _, w in kept]
        for w in written:
            self._count(f"decision.{w.decision.value}")
        copies = [
            Held(
                w.result.key if w.result.key is not None else _NO_KEY,
                m["ReceiptHandle"],
                received_at,
            )
            for m, w in zip(messages, written, strict=True)
        ]
        deadline = received_at + self._visibility
        if self._holder is None:
            self._delete(copies, deadline)
            return
        hold: list[Held] = []
        now_done: list[Held] = []
        for c, w in zip(copies, written, strict=True):
            (hold if w.awaits_outcome and w.result.key is not None else now_done).append(c)
        with self._lock:
            closed = self._closed
            if not closed:
                self._holder.hold(hold, deadline)
        if closed:  # the holder already released what it held: this batch goes back too
            self._hand_back(
                [{"ReceiptHandle": c.handle} for c in hold], "released", retry_budget=1.0
            )
        self._delete(now_done, deadline)

    def _delete(self, copies: Sequence[Held], deadline: float) -> None:
        """Delete now, retrying while the copies are still ours (after_inbox, or not held)."""
        for i in range(0, len(copies), MAX_BATCH):
            chunk = copies[i : i + MAX_BATCH]
            _, _, left = confirm(
                self._calls.settle,
                chunk,
                budget=max(deadline - _DELETE_MARGIN - time.monotonic(), 0.0),
                stopping=threading.Event(),  # a committed batch is deleted even while stopping
                name=self.subscription,
            )
            if left:
                self._count("delete_failed", len(left))
                self._count("delete_failed.unanswered", len(left))
                log.warning(
                    "%s: %d delete(s) unconfirmed; they return as replays",
                    self.subscription,
                    len(left),
                )

    def _back_off(self, messages: Sequence[dict[str, Any]]) -> None:
        """Deferred copies stay out of sight for ``quota_backoff_seconds``: a flood steps aside
        for as long, instead of coming back on every visibility timeout. Best effort: a copy
        whose change fails returns when its receive's visibility ends, as without a backoff."""
        assert self._quota_backoff is not None
        seconds = self._quota_backoff
        copies = [Held(_NO_KEY, m["ReceiptHandle"], 0.0) for m in messages]
        for i in range(0, len(copies), MAX_BATCH):
            _, lost, left = confirm(
                lambda chunk: self._calls.back_off(chunk, seconds),
                copies[i : i + MAX_BATCH],
                budget=_HAND_BACK_SECONDS,
                stopping=self._stop,
                name=self.subscription,
            )
            self._count("deferred_backoff_failed", len(lost) + len(left))

    def _hand_back(
        self, messages: Sequence[dict[str, Any]], counter: str, retry_budget: float | None = None
    ) -> None:
        """Visibility 0 for messages this consumer will not write: another replica takes them."""
        copies = [Held(_NO_KEY, m["ReceiptHandle"], 0.0) for m in messages]
        budget = _HAND_BACK_SECONDS if retry_budget is None else retry_budget
        for i in range(0, len(copies), MAX_BATCH):
            chunk = copies[i : i + MAX_BATCH]
            done, _, _ = confirm(
                self._calls.hand_back,
                chunk,
                budget=budget,
                stopping=threading.Event(),
                name=self.subscription,
            )
            self._count(counter, len(done))


#: the counters shown in ``/readyz`` (all of them are metrics)
STREAM_COUNTS: Final = (
    "received",
    "deleted",
    "delete_failed",
    "delete_retried",
    "held",
    "extended",
    "broker_lease_lost",
    "let_go",
    "released",
    "handed_back",
    "deferred_quota",
    "receive_failed",
)
#: counters the holder keeps under the names the consumer reports
_HOLDER_COUNTS: Final = ("extended", "broker_lease_lost", "let_go", "released")
#: the key of a copy that has no work row (a conflict or a quarantined delivery): never watched
_NO_KEY: Final = Key("", "")


class QueueCalls:
    """The SQS batch calls on held copies, each answer sorted entry by entry.

    Used by the :class:`~bridge.adapters.holding.Holder` (its ``BrokerLeases``) and by the
    consumer's own deletes. A call that fails as a whole raises (after counting why), and its caller
    retries; an entry SQS refuses for good is ``lost``; any other failed entry is ``retry``.
    """

    max_batch = MAX_BATCH

    def __init__(
        self,
        client: Any,
        queue_url: str,
        subscription: str,
        inbox: Inbox,
        count: Callable[[str, int], None],
    ) -> None:
        self._client = client
        self._queue_url = queue_url
        self._subscription = subscription
        self._inbox = inbox
        self._count = count

    def settle(self, held: Sequence[Held]) -> CallResult[Held]:
        """``DeleteMessageBatch``: confirmed deletes count ``deleted``."""
        entries = [{"Id": str(i), "ReceiptHandle": h.handle} for i, h in enumerate(held)]
        try:
            with self._inbox.acknowledging(self._subscription, len(held)):
                response = self._client.delete_message_batch(
                    QueueUrl=self._queue_url, Entries=entries
                )
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and _error_code(exc) in _LEASE_LOST_CODES:
                self._refused("delete_failed", _error_code(exc), len(held))
                return CallResult(lost=list(held))
            self._call_failed(exc)
            raise
        done, lost, retry = self._sort(held, response, "delete_failed")
        self._count("deleted", len(done))
        for h in done:
            self._inbox.acked(self._subscription, h.received_at)
        return CallResult(done, lost, retry)

    def extend(self, held: Sequence[Held], seconds: float) -> CallResult[Held]:
        """``ChangeMessageVisibilityBatch`` to ``seconds`` from now."""
        return self._change(held, int(seconds), "broker_lease_lost")

    def release(self, held: Sequence[Held]) -> None:
        """Visibility 0 for held copies (on stop), retried briefly; best effort."""
        _, lost, left = confirm(
            self.hand_back,
            held,
            budget=_HAND_BACK_SECONDS,
            stopping=threading.Event(),
            name=self._subscription,
        )
        if len(lost) + len(left) == len(held):
            raise BrokerUnavailable("no held delivery could be handed back")

    def hand_back(self, held: Sequence[Held]) -> CallResult[Held]:
        return self._change(held, 0, "hand_back_failed")

    def back_off(self, held: Sequence[Held], seconds: int) -> CallResult[Held]:
        """``ChangeMessageVisibilityBatch`` of copies deferred by the tenant backlog quota."""
        return self._change(held, seconds, "deferred_backoff_refused")

    def _change(self, held: Sequence[Held], seconds: int, refused: str) -> CallResult[Held]:
        entries = [
            {"Id": str(i), "ReceiptHandle": h.handle, "VisibilityTimeout": seconds}
            for i, h in enumerate(held)
        ]
        try:
            response = self._client.change_message_visibility_batch(
                QueueUrl=self._queue_url, Entries=entries
            )
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and _error_code(exc) in _LEASE_LOST_CODES:
                self._refused(refused, _error_code(exc), len(held))
                return CallResult(lost=list(held))
            self._call_failed(exc)
            raise
        done, lost, retry = self._sort(held, response, refused)
        return CallResult(done, lost, retry)

    def _sort(
        self, held: Sequence[Held], response: dict[str, Any], refused: str
    ) -> tuple[list[Held], list[Held], list[Held]]:
        """(confirmed, refused for good, worth retrying) from a batch answer."""
        done = [held[int(e["Id"])] for e in response.get("Successful", [])]
        lost: list[Held] = []
        retry: list[Held] = []
        for failure in response.get("Failed", []):
            copy = held[int(failure["Id"])]
            code = str(failure.get("Code", "unknown"))
            if code in _LEASE_LOST_CODES or failure.get("SenderFault"):
                lost.append(copy)
                self._refused(refused, code, 1)
            else:
                retry.append(copy)
        answered = {h.handle for h in done + lost + retry}
        retry += [h for h in held if h.handle not in answered]  # absent from the answer
        return done, lost, retry

    def _refused(self, counter: str, code: str, n: int) -> None:
        # broker_lease_lost itself is the holder's count; the consumer adds the reason
        if counter != "broker_lease_lost":
            self._count(counter, n)
        self._count(f"{counter}.{_reason(code)}", n)

    def _call_failed(self, exc: BaseException) -> None:
        self._count(f"call_failed.{_describe(exc)}", 1)
        log.info("%s: an SQS call failed (%s); retrying", self._subscription, _describe(exc))


def _reason(code: str) -> str:
    """An SQS error code as a counter's suffix (the query-protocol prefix dropped)."""
    return code.removeprefix("AWS.SimpleQueueService.")


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return _error_code(exc) or type(exc).__name__
    return type(exc).__name__


_REGION: Final = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def _region(text: str) -> str | None:
    if _REGION.fullmatch(text):
        return None
    return f"expected an AWS region such as 'eu-west-1', got {shown(text)}"


Region = Annotated[
    StrictStr,
    checked(_region),
    WithJsonSchema({"type": "string", "pattern": r"^[a-z0-9]+(-[a-z0-9]+)*$"}),
    Shown(kind="string, AWS region such as `eu-west-1`"),
]


class SqsSettings(SourceSettings):
    """An SQS queue. Credentials come from the AWS environment (`AWS_*`, a profile, a role),
    never from the file.
    """

    queue_url: HttpUrl = Field(description="The queue's URL, as `GetQueueUrl` returns it.")
    region: Annotated[
        Region | None,
        Shown(default="the AWS environment (`AWS_REGION`, `AWS_DEFAULT_REGION`, profile)"),
    ] = Field(default=None, description="The queue's AWS region.")
    endpoint_url: Annotated[
        HttpUrl | None, Shown(default="the AWS endpoint of the region (or `AWS_ENDPOINT_URL`)")
    ] = Field(
        default=None,
        description="Endpoint of a local SQS-compatible server, for development and tests.",
    )
    receive_batch: StrictInt = Field(
        default=RECEIVE_BATCH_DEFAULT,
        ge=1,
        le=MAX_BATCH,
        description="Messages asked for per `ReceiveMessage` call (SQS allows 10 at most).",
    )
    wait_seconds: StrictInt = Field(
        default=WAIT_SECONDS_DEFAULT,
        ge=0,
        le=20,
        description=(
            "Long-poll wait of `ReceiveMessage`; `0` polls without waiting. On SIGTERM the"
            " bridge waits for the receive in progress and hands back what it returns, so keep"
            " `shutdown_deadline_seconds` above it: what a receive still open at the deadline"
            " returns stays invisible until its visibility timeout ends."
        ),
    )
    visibility_timeout_seconds: StrictInt = Field(
        default=VISIBILITY_TIMEOUT_DEFAULT,
        ge=1,
        le=MAX_VISIBILITY_SECONDS,
        description="Visibility timeout asked for on receive and on every extension of a held "
        "delivery (`after_outcome`: each extension pushes it this far again, before it runs out).",
    )
    consumers: StrictInt = Field(
        default=CONSUMERS_DEFAULT,
        ge=1,
        le=64,
        description="Receiving loops for this subscription.",
    )
    quota_backoff_seconds: Annotated[
        StrictInt | None, Shown(default="none: back after `visibility_timeout_seconds`")
    ] = Field(
        default=None,
        ge=0,
        le=MAX_VISIBILITY_SECONDS,
        description="Visibility timeout given to a delivery the tenant backlog quota defers, "
        "so a flooding tenant's messages stay out of the receives this long instead of "
        "returning after every visibility timeout.",
    )

    def receivers(self) -> int:
        return self.consumers

    def address(self) -> str | None:
        return str(self.queue_url)


def from_config(sub: SubscriptionConfig, inbox: Inbox, store: RowWatch) -> SqsConsumer:
    """The ``sqs`` source: a boto3 client for the queue's region (and endpoint, if local)."""
    import boto3  # noqa: PLC0415  (only when an SQS subscription is configured)
    from botocore.config import Config  # noqa: PLC0415

    settings = SqsSettings.of(sub)
    session = boto3.session.Session()
    client = session.client(
        "sqs",
        region_name=settings.region,
        endpoint_url=settings.endpoint_url,
        # The long poll must finish before the read times out.
        config=Config(read_timeout=settings.wait_seconds + 10, retries={"mode": "standard"}),
    )
    # Deletes and visibility changes are retried by the consumer within each copy's deadline
    # (jittered, from 0.1 s): botocore's own retries under them (up to three tries, pauses of
    # up to seconds) would spend that deadline before the consumer could try again.
    calls_client = session.client(
        "sqs",
        region_name=settings.region,
        endpoint_url=settings.endpoint_url,
        config=Config(
            connect_timeout=CALL_TIMEOUT_SECONDS,
            read_timeout=CALL_TIMEOUT_SECONDS,
            retries={"mode": "standard", "total_max_attempts": 1},
        ),
    )
    return SqsConsumer(
        client,
        settings.queue_url,
        sub.name,
        inbox,
        store=store,
        ack_mode=sub.ack_mode.value,
        receive_batch=settings.receive_batch,
        wait_seconds=settings.wait_seconds,
        visibility_timeout=settings.visibility_timeout_seconds,
        threads=settings.consumers,
        tenant_backlog_quota=sub.backlog_quota,
        quota_backoff_seconds=settings.quota_backoff_seconds,
        calls_client=calls_client,
    )


class ProbeQueue:
    """``fencebridge check --probe``'s in-process stand-in of the SQS client.

    It hands out one message to any receive and records every delete and visibility change,
    answering each as SQS would on success; it never reaches a queue.
    """

    def __init__(self) -> None:
        self.deleted = 0
        self.changed = 0
        self._received = 0

    def receive_message(self, **_: Any) -> dict[str, Any]:
        self._received += 1
        n = self._received
        message = {
            "MessageId": f"probe-{n}",
            "ReceiptHandle": f"probe-receipt-{n}",
            "Body": "{}",
            "MessageAttributes": {},
            "Attributes": {"ApproximateReceiveCount": "1"},
        }
        return {"Messages": [message]}

    def delete_message_batch(self, **call: Any) -> dict[str, Any]:
        entries: list[dict[str, Any]] = call["Entries"]
        self.deleted += len(entries)
        return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}

    def change_message_visibility_batch(self, **call: Any) -> dict[str, Any]:
        entries: list[dict[str, Any]] = call["Entries"]
        self.changed += len(entries)
        return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}


def probe_ack_after_commit(sub: SubscriptionConfig, inbox: Inbox) -> ProbedAcks:
    """Control 8's evidence: one receive, write and delete of the consumer, against
    :class:`ProbeQueue`; the deletes it records are what this consumer acknowledged.

    It drives the ``after_inbox`` path, where the delete follows the commit at once
    (``after_outcome`` deletes later still, once the row is settled).
    """
    queue = ProbeQueue()
    consumer = SqsConsumer(queue, "probe://queue", sub.name, inbox, wait_seconds=0)
    try:
        consumer._turn()
    except Exception as exc:  # noqa: BLE001  (a failed write raises: the deletes are the evidence)
        return ProbedAcks(queue.deleted, "DeleteMessageBatch", type(exc).__name__)
    return ProbedAcks(queue.deleted, "DeleteMessageBatch")


def inspect_queue(sub: SubscriptionConfig, expected: BrokerExpectations) -> list[BrokerFinding]:
    """``fencebridge check``'s look at the broker (consumers.sqs.inspect)."""
    from consumers.sqs.inspect import inspect_queue as inspect  # noqa: PLC0415  (only when checked)

    return inspect(sub, expected)


#: the ``fencebridge.sources`` entry point of ``source = "sqs"``
ADAPTER: Final = SourceAdapter(
    settings=SqsSettings,
    open=from_config,
    messaging_system="aws_sqs",
    redelivery_days=REDELIVERY_DAYS,
    probe_ack_after_commit=probe_ack_after_commit,
    inspect_broker=inspect_queue,
)
