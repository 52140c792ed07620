"""Pub/Sub consumer: streaming pull, batched into inbox transactions, acked after commit.

The client library hands messages over one at a time on its callback threads. The callback only
queues them; writer threads gather up to ``batch_max_messages`` (or whatever arrived within
``batch_max_wait_ms`` of the first) into one :meth:`~bridge.ingest.inbox.Inbox.write`, and ack each
message only after that transaction has committed. If the write raises, every message of the
batch is nacked so it returns at once instead of after its ack deadline.

Exactly-once delivery is read from the subscription (``GetSubscription``) each time the stream
opens, never assumed. With it on, the bridge sends its acknowledgements itself, as unary
``Acknowledge`` calls of up to ``ACK_BATCH`` ack ids, each unanswered batch on a call thread of
its own (started as needed, bounded by flow control), so a writer never waits for an answer and
a batch never waits for a thread held by batches that wait for its own ack, and reads the
service's answer per ack id:

- confirmed: counted ``acked``;
- ``PERMANENT_FAILURE_INVALID_ACK_ID``: the ack id expired and the service handed the message
  out again; that copy will be a replay. Counted ``ack_id_expired``, never a processing failure;
- ``TRANSIENT_*`` or no answer: retried with jittered backoff for as long as the client
  library leases the message for (60 s with exactly-once: it keeps extending it meanwhile), then
  counted ``ack_unanswered`` (the copy comes back as a replay). With message ordering the
  service confirms an ack only after those of the copies before it, so an ack can be refused
  for a while through no fault of its own: giving up at the ack deadline let one late
  predecessor turn every ack behind it into a replay.

Acks follow the order of delivery. With message ordering the service confirms a copy's ack only
once the copies delivered before it of its ordering key are acknowledged; it refuses an early
one (``TRANSIENT_FAILURE_UNORDERED_ACK_ID``), and every later copy of the key in the same call
with it. The emulator enforces this per key across all streams of the subscription, and counts
the unkeyed copies of an ordered subscription as one more key (the service does not order them).
So the callback runs on one thread (it only queues; its order is the stream's), each batch is
acked in the order received, and when a call's ids are refused as out of order the first of them
is sent again on its own after the others. Held copies (``after_outcome``) are acked through the
holder's ack groups: a copy of an ordering key only together with or after the copies of its key
received before it, in that order, in one call; unkeyed copies wait for nothing, unless the
service refuses one as out of order (the emulator): from then on the unkeyed copies are one
group. Refusals are counted (``ack_unordered_keyed``, ``ack_unordered_unkeyed``) and retried.

Whatever the answer, the message then leaves the client's lease management (``drop``): nothing
stays leased, unacked and unredelivered. Without exactly-once, acks are best effort, as the
service defines them, and go through the client library.

Two limits of the client library are handled here. Its channel to the emulator keeps gRPC's
8 KiB limit on response metadata, and the service lists every refused ack id in the error's
metadata: past about 80 refused ids the error cannot be read (``RESOURCE_EXHAUSTED`` with a
mismatched status), the library's dispatcher then leaves the futures of that whole request
unresolved and its lease manager can wait on them for ever. The bridge builds its emulator
channel with the 4 MiB limit the library uses for the real service (:func:`subscriber_client`).
And the library's minimum lease extension for exactly-once (60 s) is honoured for messages that
wait for their write.

``after_inbox`` (default): every delivery the database now holds (new, replay, conflict,
quarantined) is acked right after COMMIT; the broker was only a wake-up signal.

``after_outcome``: deliveries with a work row are held. They leave the client's own lease
management (``Message.drop``) and a :class:`~bridge.adapters.holding.Holder` keeps each one's ack
deadline itself: it extends (``ModifyAckDeadline``) a copy whose row is still queued or whose
claim's lease is live once that copy's own deadline comes near, acks it as soon as its row is
terminal or parked, and lets go of a copy whose claim stalled, so the service redelivers it (a
replay). A delivery is never held longer than ``max_lease_duration``.

The subscription's ack deadline (``ack_deadline_seconds``) is the lease length of held copies:
how long a delivery stays out of reach after the bridge stops extending it.

Tenant backlog quota (``tenant_backlog_quota``): a delivery the inbox defers because its
tenant's open backlog is at the quota leaves the client's lease management unacked (``drop``,
counted ``deferred_quota``), as a message that could not be queued does; the service hands it
out again once its ack deadline runs out. A nack would return it at once and turn the flood
into a loop. Each return counts as a delivery attempt for a dead-letter policy.

On stop, messages received but not yet written are nacked at once, held ones are handed back
(deadline 0), and whatever was written is acked first: another replica takes them without
waiting out a deadline.

Ordering keys and ``delivery_attempt`` (set when the subscription has a dead-letter policy) are
recorded on the row; rows of one ordering key are claimed in order by the store.

Stream errors: the client reconnects by itself after transient errors (``UNAVAILABLE``), so a
probe (``GetSubscription``) checks the service every ``probe_interval`` seconds; while it
fails, :meth:`PubSubConsumer.status` is ``(False, reason)``. When the stream ends with an error
(the subscription is gone, a permission was revoked, an emulator restarted), the consumer logs
why and opens a new stream with jittered backoff. Messages received on the ended stream are
still written; without exactly-once they can no longer be acked (the library's dispatcher for
that stream is gone) and come back as replays. The consumer never dies silently.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Annotated, Any, Final

import grpc
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler
from pydantic import Field, StrictInt, StrictStr, WithJsonSchema
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_random_exponential,
)

from bridge.adapters.kit import (
    Backoff,
    BrokerExpectations,
    BrokerFinding,
    Deadline,
    Deferred,
    Holder,
    Inbox,
    ProbedAcks,
    RowWatch,
    Service,
    Shown,
    SourceAdapter,
    SourceSettings,
    SubscriptionConfig,
    Table,
    Written,
    checked,
    confirm,
    producer_traceparent,
    shown,
    stream_status,
)
from bridge.types import Key, RawDelivery
from consumers.pubsub.acks import ACK_BATCH, AckCalls, describe
from consumers.pubsub.ordering import KeyBarriers

log = logging.getLogger(__name__)

EMULATOR_HOST_ENV: Final = "PUBSUB_EMULATOR_HOST"
#: the channel limits the client library gives its channel to the real service
CHANNEL_OPTIONS: Final = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_metadata_size", 4 * 1024 * 1024),
)
FLOW_MAX_MESSAGES_DEFAULT: Final = 1000
FLOW_MAX_BYTES_DEFAULT: Final = 100 * 1024 * 1024
MAX_LEASE_DURATION_DEFAULT: Final = 3600.0
BATCH_MAX_MESSAGES_DEFAULT: Final = 100
BATCH_MAX_WAIT_MS_DEFAULT: Final = 50
WRITERS_DEFAULT: Final = 1
#: a topic keeps messages at most 31 days (retention with seek)
REDELIVERY_DAYS: Final = 31
PROBE_INTERVAL_DEFAULT: Final = 10.0
#: the service's bounds for one ack deadline (seconds)
ACK_DEADLINE_MIN: Final = 10
ACK_DEADLINE_MAX: Final = 600
#: the client library's floor for lease extensions with exactly-once delivery (seconds)
EXACTLY_ONCE_LEASE_MIN: Final = 60
_BACKOFF_MAX: Final = 10.0
#: seconds a stream must have run for its end to restart the reconnect backoff
_HEALTHY_STREAM: Final = 60.0
_ACK_MODES: Final = ("after_inbox", "after_outcome")


def subscriber_client(emulator_host: str | None = None) -> Any:
    """A subscriber client; towards an emulator (``emulator_host``, else
    ``PUBSUB_EMULATOR_HOST``), with the real service's channel limits.

    Its channel reads error metadata up to 4 MiB, as the client library's channel to the real
    service does (an exactly-once ack error lists every refused ack id there); the library's
    own emulator channel keeps gRPC's 8 KiB default, past which such an error cannot be read.
    """
    host = emulator_host or os.environ.get(EMULATOR_HOST_ENV)
    if not host:
        return pubsub_v1.SubscriberClient()
    from google.pubsub_v1.services.subscriber.transports.grpc import (  # noqa: PLC0415
        SubscriberGrpcTransport,
    )

    channel = grpc.insecure_channel(host, options=list(CHANNEL_OPTIONS))
    # A client given its transport needs neither the emulator variable nor credentials.
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def to_raw(subscription: str, message: Any) -> RawDelivery:
    """A Pub/Sub message as a broker-neutral delivery."""
    attributes = {str(k): str(v) for k, v in message.attributes.items()}
    attempt = message.delivery_attempt
    return RawDelivery(
        subscription=subscription,
        message_id=message.message_id or None,
        body=bytes(message.data),
        attributes=attributes,
        receive_count=attempt if isinstance(attempt, int) and attempt > 0 else None,
        ordering_key=message.ordering_key or None,
        # W3C traceparent, else the client library's googclient_traceparent; validated.
        trace_context=producer_traceparent(attributes),
    )


@dataclass(frozen=True, slots=True)
class _Received:
    """A message waiting for its inbox transaction."""

    message: Any
    raw: RawDelivery
    #: the stream it came from; without exactly-once it cannot be acked once that stream ended
    stream: int
    received_at: float
    #: its place in the order the consumer received its messages (the stream's order)
    arrival: int

    @property
    def handle(self) -> str:
        ack_id: str = self.message.ack_id
        return ack_id

    @property
    def ordering_key(self) -> str | None:
        return self.raw.ordering_key

    @property
    def message_id(self) -> str | None:
        return self.raw.message_id


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery kept unacknowledged until its work row's outcome (after_outcome)."""

    #: None for a copy with no outcome to wait for (a conflict, a quarantined delivery)
    key: Key | None
    message: Any
    received_at: float
    #: its place in the order the consumer received its messages (the stream's order)
    arrival: int = 0

    @property
    def handle(self) -> str:
        ack_id: str = self.message.ack_id
        return ack_id


class PubSubConsumer:
    """Receives one Pub/Sub subscription for one bridge subscription. Never dies silently."""

    def __init__(
        self,
        client: Any,
        subscription_path: str,
        subscription: str,
        inbox: Inbox,
        *,
        store: RowWatch | None = None,
        ack_mode: str = "after_inbox",
        max_messages: int = FLOW_MAX_MESSAGES_DEFAULT,
        max_bytes: int = FLOW_MAX_BYTES_DEFAULT,
        max_lease_duration: float = MAX_LEASE_DURATION_DEFAULT,
        batch_max_messages: int = BATCH_MAX_MESSAGES_DEFAULT,
        batch_max_wait_ms: int = BATCH_MAX_WAIT_MS_DEFAULT,
        writers: int = 1,
        probe_interval: float = PROBE_INTERVAL_DEFAULT,
        close_client: bool = False,
        tenant_backlog_quota: int | None = None,
    ) -> None:
        if ack_mode not in _ACK_MODES:
            raise ValueError(f"unknown ack mode {ack_mode!r}")
        if ack_mode == "after_outcome" and store is None:
            raise ValueError("after_outcome needs the store to watch work rows")
        if writers < 1 or batch_max_messages < 1 or max_messages < 1:
            raise ValueError("writers, batch_max_messages and max_messages must be positive")
        if tenant_backlog_quota is not None and tenant_backlog_quota < 1:
            raise ValueError("tenant_backlog_quota is a number of rows, at least 1 (None: none)")
        self._quota = tenant_backlog_quota
        self._client = client
        self._path = subscription_path
        self.subscription = subscription
        self._inbox = inbox
        self._store = store
        self._ack_mode = ack_mode
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_lease = max_lease_duration
        self._batch_max = batch_max_messages
        self._batch_wait = batch_max_wait_ms / 1000
        self._probe_interval = probe_interval
        self._close_client = close_client

        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: deque[_Received] = deque()
        self._arrivals = itertools.count()
        self._stopping = threading.Event()
        #: stop's deadline ran out: unanswered acks are given up (their messages come back)
        self._abandon = threading.Event()
        self._wake = threading.Event()
        #: the current stream; without exactly-once, earlier streams' messages cannot be acked
        self._stream = 0
        self._exactly_once = False
        self._ordered = False
        #: the service refused an unkeyed copy's ack as out of order: it orders the unkeyed
        #: copies of an ordered subscription as one key (the emulator does; the service not)
        self._unkeyed_ordered = False
        self._ack_deadline = ACK_DEADLINE_MIN
        self._stream_error: str | None = "not connected yet"
        self._write_error: str | None = None
        self._future: Any = None
        #: why the current stream is being closed on purpose, if it is
        self._reopen: str | None = None
        self._closed = False

        self._barriers = KeyBarriers()
        self._calls = AckCalls(client, subscription_path, unordered=self._refused_unordered)
        # One call thread per unanswered batch, started as needed: a batch must never wait
        # for a thread held by batches that wait for its own ack (with message ordering the
        # service confirms an ack only after the acks of the messages delivered before it).
        # Flow control bounds them: every batch holds at least one outstanding message.
        self._acks = ThreadPoolExecutor(
            max_messages, thread_name_prefix=f"pubsub-{subscription}-ack"
        )
        self._holder: Holder[Held] | None = None
        if ack_mode == "after_outcome":
            assert store is not None
            self._holder = Holder(
                f"pubsub-{subscription}",
                store,
                self._calls,
                extension=ACK_DEADLINE_MIN,  # the subscription's, once the stream opens
                limit=max_lease_duration,
                supervise=inbox.supervised,
                on_settled=self._held_acked,
                order=self._ack_group,
            )

        # Supervised loops: an unexpected error is logged by type, counted (here and in
        # fencebridge.thread.restarts), backed off with jitter and the loop run again; one that
        # keeps failing makes /healthz fail, past the bridge's limits.
        self._supervisor = inbox.supervised(
            f"pubsub:{subscription}:stream",
            self._stream_round,
            label="pubsub_stream",
            stop=self._stopping,
            backoff=Backoff(initial=0.2, cap=_BACKOFF_MAX),
            thread_name=f"pubsub-{subscription}-stream",
        )
        self._writers = [
            inbox.supervised(
                f"pubsub:{subscription}:write-{i}",
                self._write_once,
                label="pubsub_writer",
                stop=self._stopping,
                backoff=Backoff(initial=0.2, cap=_BACKOFF_MAX),
                thread_name=f"pubsub-{subscription}-write-{i}",
            )
            for i in range(writers)
        ]

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        for writer in self._writers:
            writer.start()
        if self._holder is not None:
            self._holder.start()
        self._supervisor.start()
        # The inbox reports these counts as metrics (acks, extensions, lost leases...).
        self._inbox.observe_stream(self.subscription, lambda: self.counts)

    def stop(self, deadline: float = 30.0) -> None:
        """Stop receiving: hand back what was not written, ack what was, release what is held.

        Messages received but not yet written are nacked at once, and so is anything that
        arrives after this; the batches being written finish and are acknowledged; held
        deliveries (after_outcome) are handed back (deadline 0) so another bridge gets them
        now. The stream is closed last, so those calls still reach the service.
        """
        if self._closed:
            return
        end = time.monotonic() + deadline
        self._stopping.set()
        with self._cond:
            leftover = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        self._nack(leftover)
        for writer in self._writers:
            writer.join(Deadline(max(end - time.monotonic(), 0)))
        # Acks in flight end within their ack deadline, or when the deadline here runs out.
        closer = threading.Thread(target=self._acks.shutdown, name=f"{self.subscription}-close")
        closer.start()
        _join(closer, end)
        self._abandon.set()
        if self._holder is not None:
            self._holder.stop(max(end - time.monotonic(), 1.0))
        self._wake.set()
        self._supervisor.join(Deadline(max(end - time.monotonic(), 0)))
        self._closed = True
        if self._close_client:
            self._client.close()
        counts = self.counts
        log.info(
            "%s: stopped; handed back %d unwritten and %d held deliveries",
            self.subscription,
            len(leftover),
            counts["released"],
        )

    def status(self) -> tuple[bool, str]:
        """Ready, and why not; when ready, the stream's counters."""
        if self._stopping.is_set():
            return True, "stopping"
        return stream_status(
            self.subscription,
            [self._supervisor, *self._writers],
            self._stream_error,
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
            for theirs, ours in _HOLDER_COUNTS.items():
                counts[ours] += self._holder.counts[theirs]
            counts["held"] = len(self._holder)
        return counts

    def held(self) -> int:
        """Deliveries held until their rows' outcomes (after_outcome)."""
        return len(self._holder) if self._holder is not None else 0

    @property
    def exactly_once(self) -> bool:
        """Whether the subscription had exactly-once delivery on when the stream last opened."""
        return self._exactly_once

    @property
    def ack_deadline(self) -> int:
        """The subscription's ack deadline in seconds, as read when the stream last opened."""
        return self._ack_deadline

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    # -- the stream -------------------------------------------------------------------------------

    def services(self) -> list[Service]:
        """Its supervised loops, for ``/healthz`` and ``/readyz``."""
        holder = [self._holder.service] if self._holder is not None else []
        return [self._supervisor, *self._writers, *holder]

    def _stream_round(self) -> None:
        """Streams until stopped; a stream that ends is reopened with a fresh backoff.

        An error that is not the stream ending goes to the supervisor.
        """
        retrying = Retrying(
            stop=stop_when_event_set(self._stopping),
            wait=wait_random_exponential(multiplier=0.2, max=_BACKOFF_MAX),
            retry=retry_if_exception_type(_StreamEndedError),
            sleep=self._pause,
            retry_error_callback=lambda _state: None,
        )
        try:
            retrying(self._stream_once)
        except Exception:
            self._count("supervisor_errors")
            raise

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _stream_once(self) -> None:
        """Open a stream and watch it; raises :class:`_StreamEndedError` when it ends badly."""
        try:
            future = self._open()
        except Exception as exc:
            self._report_stream_error(f"cannot open the subscription: {describe(exc)}")
            raise _StreamEndedError from exc
        opened = time.monotonic()
        ended = self._watch(future)
        if ended is None:  # stopping
            future.cancel()
            try:
                future.result(timeout=10)
            except Exception as exc:  # noqa: BLE001
                log.info("%s: stream closed with %s", self.subscription, describe(exc))
            return
        self._end_stream()
        self._count("reconnects")
        self._report_stream_error(f"stream ended: {ended}")
        if time.monotonic() - opened < _HEALTHY_STREAM:
            raise _StreamEndedError
        self._pause(0.2)  # a stream that ran for a while was healthy: reconnect at once

    def _open(self) -> Any:
        """Read the subscription's settings and open a streaming pull with them."""
        found = self._client.get_subscription(
            request={"subscription": self._path}, retry=None, timeout=self._probe_timeout
        )
        self._exactly_once = bool(found.enable_exactly_once_delivery)
        self._ordered = bool(found.enable_message_ordering)
        deadline = int(found.ack_deadline_seconds) or ACK_DEADLINE_MIN
        self._ack_deadline = min(max(deadline, ACK_DEADLINE_MIN), ACK_DEADLINE_MAX)
        if self._holder is not None:
            self._holder.set_extension(self._ack_deadline)
        # Messages waiting for their write stay in the library's lease management; with
        # exactly-once its lease extensions must not go below its own floor.
        lease = self._client_lease()
        flow = pubsub_v1.types.FlowControl(
            max_messages=self._max_messages,
            max_bytes=self._max_bytes,
            max_lease_duration=self._max_lease,
            min_duration_per_lease_extension=lease,
            max_duration_per_lease_extension=lease,
        )
        with self._lock:
            stream = self._stream
        # One callback thread: the callback only queues, and its order is then the stream's,
        # which acks must follow (see _ack). The library shuts the scheduler down with the stream.
        callbacks = ThreadPoolExecutor(1, thread_name_prefix=f"pubsub-{self.subscription}-cb")
        future = self._client.subscribe(
            self._path,
            callback=partial(self._on_message, stream),
            flow_control=flow,
            scheduler=ThreadScheduler(executor=callbacks),
        )
        self._wake.clear()
        future.add_done_callback(lambda _: self._wake.set())
        if self._stream_error is not None:
            log.info(
                "%s: receiving (exactly-once delivery %s, ack deadline %ds)",
                self.subscription,
                "on" if self._exactly_once else "off",
                self._ack_deadline,
            )
        self._stream_error = None
        self._reopen = None
        self._future = future
        return future

    @property
    def _probe_timeout(self) -> float:
        return max(min(self._probe_interval, 10.0), 1.0)

    def _watch(self, future: Any) -> str | None:
        """Probe the service until the stream ends (its error, described) or we stop (None)."""
        while not self._stopping.is_set():
            self._wake.wait(self._probe_interval)
            if self._stopping.is_set():
                return None
            if future.done():
                exc = future.exception()
                if exc is not None:
                    return describe(exc)
                return self._reopen or "closed by the client library"
            self._probe()
        return None

    def _probe(self) -> None:
        """The client hides reconnect attempts: ask the service directly whether it answers."""
        try:
            found = self._client.get_subscription(
                request={"subscription": self._path}, retry=None, timeout=self._probe_timeout
            )
        except Exception as exc:  # noqa: BLE001
            self._report_stream_error(f"GetSubscription failed: {describe(exc)}")
            return
        if bool(found.enable_exactly_once_delivery) != self._exactly_once:
            # Acks must follow the setting: close this stream; the next one reads it again.
            self._reopen = "the exactly-once delivery setting changed"
            self._future.cancel()
            return
        if self._stream_error is not None:
            log.info("%s: the subscription answers again", self.subscription)
        self._stream_error = None

    def _report_stream_error(self, reason: str) -> None:
        if self._stream_error != reason:
            log.warning("%s (%s): not receiving: %s", self.subscription, self._path, reason)
        self._stream_error = reason

    def _end_stream(self) -> None:
        """The stream ended: without exactly-once, its messages can no longer be acked."""
        with self._lock:
            self._stream += 1

    def _on_message(self, stream: int, message: Any) -> None:
        """The client's callback: queue only, so its threads are never blocked."""
        try:
            if self._stopping.is_set():
                message.nack()
                self._count("nacked")
                return
            raw = to_raw(self.subscription, message)
            item = _Received(message, raw, stream, time.monotonic(), next(self._arrivals))
            self._count("received")
            with self._cond:
                self._pending.append(item)
                if len(self._pending) == 1 or len(self._pending) >= self._batch_max:
                    self._cond.notify_all()
        except Exception:
            # Neither acked nor nacked (a nack could loop hot): out of lease management, the
            # message returns once its ack deadline runs out.
            log.exception("%s: unexpected error queueing a message", self.subscription)
            with suppress(Exception):
                message.drop()

    # -- writing ----------------------------------------------------------------------------------

    def _write_once(self) -> None:
        """Write the next batch; raises when it failed (nothing of it was acked), for the
        supervisor to log, count and back off."""
        batch = self._next_batch()
        if not batch:
            return
        try:
            self._write(batch)
        except Exception:
            self._count("writer_errors")
            raise

    def _next_batch(self) -> list[_Received]:
        """Wait for a batch: full, or the first message waited ``batch_max_wait_ms``.

        Returns an empty batch only when stopping; another writer taking the messages this one
        waited for sends it back to waiting.
        """
        with self._cond:
            while True:
                while not self._pending or self._held_full():
                    if self._stopping.is_set():
                        return []
                    self._cond.wait(timeout=1.0)
                first = self._pending[0].received_at
                while len(self._pending) < self._batch_max and not self._stopping.is_set():
                    left = first + self._batch_wait - time.monotonic()
                    if left <= 0 or not self._pending:
                        break
                    self._cond.wait(timeout=left)
                take = min(len(self._pending), self._batch_max)
                if take:
                    return [self._pending.popleft() for _ in range(take)]

    def _held_full(self) -> bool:
        """after_outcome: held deliveries have left the client's flow control; bound them here."""
        return self._holder is not None and len(self._holder) >= self._max_messages

    def _write(self, batch: list[_Received]) -> None:
        # A message of an ordering key whose earlier message left unwritten waits for it.
        batch, held_back = self._barriers.sort(batch)
        if held_back:
            self._drop(held_back, "ordering_held_back")
        if not batch:
            return
        try:
            # Raises when the transaction did not commit: nothing is acked below.
            outcomes = self._inbox.admit([r.raw for r in batch], quota=self._quota)
        except Exception:  # whatever failed, nothing may be acked; the supervisor logs it
            self._count("write_failed")
            self._barriers.left_unwritten(batch, self._barrier_ttl())
            self._nack(batch)
            log.warning(
                "%s: inbox write failed; %d message(s) nacked", self.subscription, len(batch)
            )
            raise
        # Deferred by the tenant backlog quota: out of the client's lease management, neither
        # acked nor nacked (a nack would bring the flood straight back); each returns once its
        # ack deadline runs out, which paces the retries.
        deferred = [i for i, o in zip(batch, outcomes, strict=True) if isinstance(o, Deferred)]
        if deferred:
            self._barriers.left_unwritten(deferred, self._barrier_ttl())
            self._drop(deferred, "deferred_quota")
        kept = [(i, o) for i, o in zip(batch, outcomes, strict=True) if isinstance(o, Written)]
        batch = [i for i, _ in kept]
        written = [w for _, w in kept]
        for w in written:
            self._count(f"decision.{w.decision.value}")
        if not batch:
            return
        if self._holder is None:
            self._ack(batch)
            return
        # Every copy goes through the holder, those with nothing to wait for too: with message
        # ordering and exactly-once, a copy can be acknowledged only after the copies before it
        # of its key, so an ack may wait on the broker, and the copy must stay leased meanwhile.
        hold = [
            Held(
                w.result.key if w.awaits_outcome else None,
                item.message,
                item.received_at,
                item.arrival,
            )
            for item, w in zip(batch, written, strict=True)
        ]
        # The client's receipt acknowledgement may have asked for as little as the ack deadline
        # (its lease grows to its floor only once its lease manager has run), and it may have
        # renewed it since: the earliest the copies' deadline can end.
        earliest = min(h.received_at for h in hold) + self._ack_deadline
        # Held before they leave the client: a drop hands the client's next message of the
        # ordering key to the callback, and the holder must know the earlier copy by then to
        # keep their acks in order.
        self._holder.hold(hold, deadline=earliest)
        for h in hold:
            # From now on the holder keeps the deadline; the client must not extend it too.
            h.message.drop()

    def _barrier_ttl(self) -> float:
        """How long an ordering key waits for its message that left unwritten: by then that
        copy was handed out again (to this consumer or another one)."""
        return float(self._client_lease() + self._ack_deadline)

    def _client_lease(self) -> int:
        """The lease the client library gives messages awaiting their write (seconds)."""
        if self._exactly_once:
            return max(self._ack_deadline, EXACTLY_ONCE_LEASE_MIN)
        return self._ack_deadline

    def _current_stream(self) -> int:
        with self._lock:
            return self._stream

    def _live(self, items: Sequence[_Received]) -> list[_Received]:
        """The items whose stream is still open; the others cannot go through the library."""
        current = self._current_stream()
        live = [i for i in items if i.stream == current]
        self._count("stream_lost", len(items) - len(live))
        return live

    def _nack(self, items: Sequence[_Received]) -> None:
        live = self._live(items)
        for item in live:
            item.message.nack()
        self._count("nacked", len(live))

    def _ack(self, items: Sequence[_Received]) -> None:
        """Ack committed deliveries; with exactly-once, on a call thread, answered per ack id."""
        if not items:
            return
        if not self._exactly_once:
            live = self._live(items)
            for item in live:
                item.message.ack()
                self._inbox.acked(self.subscription, item.received_at)
            self._count("acked", len(live))
            return
        # In the order received, so the ack ids of a call follow the service's delivery order
        # (with message ordering it confirms them only in that order).
        items = sorted(items, key=attrgetter("arrival"))
        for i in range(0, len(items), ACK_BATCH):
            chunk = items[i : i + ACK_BATCH]
            # A writer never waits here: the messages acked are bounded by flow control.
            try:
                self._acks.submit(self._ack_confirmed, chunk)
            except RuntimeError:  # shut down while stopping
                self._drop(chunk, "ack_unanswered")

    def _ack_confirmed(self, chunk: list[_Received]) -> None:
        try:
            done, lost, left = confirm(
                self._calls.settle,
                chunk,
                # The client keeps extending the chunk's leases until it is dropped below.
                budget=float(self._client_lease()),
                stopping=self._abandon,
                name=self.subscription,
            )
            self._count("acked", len(done))
            for item in done:
                self._inbox.acked(self.subscription, item.received_at)
            # Refused for good: the ack id expired and the message went out again (a replay).
            self._drop(lost, "ack_id_expired")
            self._drop(left, "ack_unanswered")
            if left:
                log.warning(
                    "%s: %d ack(s) unanswered within the client's lease; they return as replays",
                    self.subscription,
                    len(left),
                )
            for item in done:
                item.message.drop()
        except Exception:  # a call thread never dies; the messages come back as replays
            self._count("ack_errors")
            log.exception("%s: unexpected error acknowledging", self.subscription)
            self._drop(chunk, "ack_unanswered")

    def _ack_group(self, held: Held) -> tuple[str, int] | None:
        """A held copy's ack group, for the holder: its ordering key on an ordered exactly-once
        subscription, where the service confirms a key's acks only in delivery order. Unkeyed
        copies have none, unless the service was seen ordering them (then they are one group)."""
        if not (self._exactly_once and self._ordered):
            return None
        key = held.message.ordering_key
        if key:
            return f"k:{key}", held.arrival
        return ("u", held.arrival) if self._unkeyed_ordered else None

    def _refused_unordered(self, refused: Sequence[Any]) -> None:
        """Acks the service refused as out of order: counted, keyed or not. An unkeyed one shows
        that the service orders unkeyed copies too: from now on they are acked in order."""
        keyed = sum(1 for r in refused if r.message.ordering_key)
        self._count("ack_unordered_keyed", keyed)
        self._count("ack_unordered_unkeyed", len(refused) - keyed)
        if keyed < len(refused) and not self._unkeyed_ordered:
            self._unkeyed_ordered = True
            log.info(
                "%s: the service orders the acks of unkeyed messages too; acking them in order",
                self.subscription,
            )

    def _held_acked(self, held: Sequence[Held]) -> None:
        """Held copies whose acks were confirmed: their receive-to-ack time."""
        for h in held:
            self._inbox.acked(self.subscription, h.received_at)

    def _drop(self, items: Sequence[_Received], counted_as: str) -> None:
        """Out of the client's lease management: nothing stays leased and unacked."""
        for item in items:
            with suppress(Exception):
                item.message.drop()
        self._count(counted_as, len(items))


class _StreamEndedError(Exception):
    """The stream ended before it was healthy for long: reconnect after a backoff."""


#: counters shown in /readyz and exported as metrics, in this order
STREAM_COUNTS: Final = (
    "received",
    "acked",
    "ack_id_expired",
    "ack_unanswered",
    "ack_retried",
    "ack_unordered_keyed",
    "ack_unordered_unkeyed",
    "nacked",
    "held",
    "extended",
    "broker_lease_lost",
    "let_go",
    "released",
    "stream_lost",
    "reconnects",
    "write_failed",
    "deferred_quota",
    "ordering_held_back",
)
#: the holder's counters under the consumer's names
_HOLDER_COUNTS: Final = {
    "settled": "acked",
    "settle_refused": "ack_id_expired",
    "settle_retried": "ack_retried",
    "extended": "extended",
    "broker_lease_lost": "broker_lease_lost",
    "let_go": "let_go",
    "released": "released",
}


def _join(thread: threading.Thread, end: float) -> None:
    if thread.ident is not None:
        thread.join(timeout=max(end - time.monotonic(), 0))


_PATH: Final = re.compile(r"projects/[^/\s]+/subscriptions/[^/\s]+")


def _path(text: str) -> str | None:
    if _PATH.fullmatch(text):
        return None
    return f"expected 'projects/<project>/subscriptions/<id>', got {shown(text)}"


SubscriptionPath = Annotated[
    StrictStr,
    checked(_path),
    WithJsonSchema({"type": "string", "pattern": r"^projects/[^/\s]+/subscriptions/[^/\s]+$"}),
    Shown(kind="string, `projects/<project>/subscriptions/<id>`"),
]


class FlowControl(Table):
    """Pub/Sub streaming-pull flow control (the client library's `FlowControl`): how much may
    be received and not yet acknowledged at once. Written inline, e.g.
    `flow_control = { max_messages = 1000 }`.
    """

    max_messages: StrictInt = Field(
        default=FLOW_MAX_MESSAGES_DEFAULT,
        ge=1,
        le=100_000,
        description="Most messages outstanding at once.",
    )
    max_bytes: StrictInt = Field(
        default=FLOW_MAX_BYTES_DEFAULT,
        ge=1024,
        le=10 * 1024**3,
        description="Most bytes outstanding at once.",
    )
    max_lease_duration_seconds: StrictInt = Field(
        default=int(MAX_LEASE_DURATION_DEFAULT),
        ge=10,
        le=86400,
        description="Longest the client keeps extending a message's ack deadline. With "
        '`ack_mode = "after_outcome"`, a delivery held longer is redelivered; its work row is '
        "untouched and the redelivery is a replay.",
    )


class PubSubSettings(SourceSettings):
    """A Pub/Sub subscription. The client library chooses the endpoint and credentials itself
    (`PUBSUB_EMULATOR_HOST`, `GOOGLE_APPLICATION_CREDENTIALS`); the file holds no secret.
    """

    subscription: SubscriptionPath = Field(
        description="The subscription's full path. The emulator is chosen with "
        "`PUBSUB_EMULATOR_HOST`, which the client library reads itself."
    )
    flow_control: Annotated[FlowControl, Shown(default="as listed below")] = Field(
        default_factory=FlowControl,
        description="Streaming-pull flow control; its keys are listed below.",
    )
    batch_max_messages: StrictInt = Field(
        default=BATCH_MAX_MESSAGES_DEFAULT,
        ge=1,
        le=1000,
        description="Pub/Sub hands messages over one at a time; the bridge gathers them into "
        "inbox transactions of at most this many.",
    )
    batch_max_wait_ms: StrictInt = Field(
        default=BATCH_MAX_WAIT_MS_DEFAULT,
        ge=0,
        le=10_000,
        description="Longest a received message waits for its inbox batch to fill.",
    )
    consumers: StrictInt = Field(
        default=WRITERS_DEFAULT,
        ge=1,
        le=64,
        description="Threads that write this subscription's received messages to the inbox.",
    )

    def receivers(self) -> int:
        return self.consumers

    def address(self) -> str | None:
        return str(self.subscription)


def from_config(config: SubscriptionConfig, inbox: Inbox, store: RowWatch) -> PubSubConsumer:
    """The ``fencebridge.sources`` factory for ``source = "pubsub"``.

    The client library chooses the endpoint and credentials itself (``PUBSUB_EMULATOR_HOST``,
    ``GOOGLE_APPLICATION_CREDENTIALS``); the configuration holds no secret.
    """
    settings = PubSubSettings.of(config)
    flow = settings.flow_control
    return PubSubConsumer(
        subscriber_client(),
        settings.subscription,
        config.name,
        inbox,
        store=store,
        ack_mode=config.ack_mode.value,
        max_messages=flow.max_messages,
        max_bytes=flow.max_bytes,
        max_lease_duration=float(flow.max_lease_duration_seconds),
        batch_max_messages=settings.batch_max_messages,
        batch_max_wait_ms=settings.batch_max_wait_ms,
        writers=settings.consumers,
        close_client=True,
        tenant_backlog_quota=config.backlog_quota,
    )


class ProbeMessage:
    """``fencebridge check --probe``'s stand-in of the client library's received message: it
    records its acks, nacks and drops."""

    def __init__(self, n: int) -> None:
        self.message_id = f"probe-{n}"
        self.ack_id = f"probe-ack-{n}"
        self.data = b"{}"
        self.attributes: dict[str, str] = {}
        self.delivery_attempt: int | None = None
        self.ordering_key = ""
        self.acked = 0
        self.nacked = 0

    def ack(self) -> None:
        self.acked += 1

    def nack(self) -> None:
        self.nacked += 1

    def drop(self) -> None:
        return None


class ProbeSubscriber:
    """``fencebridge check --probe``'s in-process stand-in of the subscriber client: it
    records the ack ids of every ``Acknowledge`` and answers as the service does on success;
    it never reaches a subscription."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.modified = 0
        self._lock = threading.Lock()

    def acknowledge(self, *, request: Mapping[str, Any], **_: Any) -> None:
        with self._lock:
            self.acknowledged += len(request["ack_ids"])

    def modify_ack_deadline(self, *, request: Mapping[str, Any], **_: Any) -> None:
        with self._lock:
            self.modified += len(request["ack_ids"])

    def close(self) -> None:
        return None


def probe_ack_after_commit(sub: SubscriptionConfig, inbox: Inbox) -> ProbedAcks:
    """Control 8's evidence: one delivery per acknowledgement path (the client library's
    ``ack``, and the unary ``Acknowledge`` of exactly-once delivery) through the consumer's
    queue, write and ack, against :class:`ProbeSubscriber` and :class:`ProbeMessage`.

    It drives the ``after_inbox`` path, where the ack follows the commit at once
    (``after_outcome`` acks later still, once the row is settled).
    """
    client = ProbeSubscriber()
    path = "projects/fencebridge-probe/subscriptions/probe"
    consumer = PubSubConsumer(client, path, sub.name, inbox, batch_max_messages=1)
    messages: list[ProbeMessage] = []
    raised: str | None = None
    try:
        for n, exactly_once in enumerate((False, True), start=1):
            consumer._exactly_once = exactly_once
            message = ProbeMessage(n)
            messages.append(message)
            consumer._on_message(0, message)
            try:
                consumer._write_once()
            except Exception as exc:  # noqa: BLE001  (a failed write raises: acks are the evidence)
                raised = type(exc).__name__
    finally:
        consumer._acks.shutdown(wait=True)  # the exactly-once ack runs on a call thread
    acks = sum(m.acked for m in messages) + client.acknowledged
    return ProbedAcks(acks, "ack/Acknowledge", raised)


def inspect_subscription(
    sub: SubscriptionConfig, expected: BrokerExpectations
) -> list[BrokerFinding]:
    """``fencebridge check``'s look at the broker (consumers.pubsub.inspect)."""
    from consumers.pubsub.inspect import inspect_subscription as inspect  # noqa: PLC0415  (only when checked)

    return inspect(sub, expected)


#: the ``fencebridge.sources`` entry point of ``source = "pubsub"``
ADAPTER: Final = SourceAdapter(
    settings=PubSubSettings,
    open=from_config,
    messaging_system="gcp_pubsub",
    redelivery_days=REDELIVERY_DAYS,
    probe_ack_after_commit=probe_ack_after_commit,
    inspect_broker=inspect_subscription,
)
