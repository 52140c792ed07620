"""Pub/Sub consumer: streaming pull, batched into inbox transactions, acked after commit.

The client library hands messages over one at a time on its callback threads. The callback only
queues them; writer threads gather up to ``batch_max_messages`` (or whatever arrived within
``batch_max_wait_ms`` of the first) into one :meth:`~bridge.inbox.Inbox.write`, and ack each
message only after that transaction has committed. If the write raises, every message of the
batch is nacked so it returns at once instead of after its ack deadline.

Exactly-once delivery is read from the subscription (``GetSubscription``) each time the stream
opens, never assumed. With it on, acks go through ``ack_with_response()`` and their results are
awaited: ``INVALID_ACK_ID`` means the ack id expired before the ack arrived (the message was
already handed out again and that copy will be a replay), counted as ``ack_id_expired`` and
never treated as a processing failure; ``OTHER`` results are retried within the ack deadline,
then left to redelivery. Without it, acks are best effort, as the service defines them.

``after_inbox`` (default): every delivery the database now holds (new, replay, conflict,
quarantined) is acked right after COMMIT; the broker was only a wake-up signal.

``after_outcome``: deliveries with a work row are held. They leave the client's own lease
management (``Message.drop``) and a holder thread decides, every third of the ack deadline,
from the rows' state (:meth:`~bridge.store.PostgresStore.watch`): ack those terminal or
parked, extend (``ModifyAckDeadline``) those still queued or whose claim's lease is live, and
let go of those whose claim stalled, so the service redelivers them (a replay) once their
deadline lapses. A delivery is never held longer than ``max_lease_duration``, the same cap the
client applies to messages waiting for their write, so nothing is kept alive forever.

The subscription's ack deadline (``ack_deadline_seconds``) is the one lease length used: for
the client's receipt and lease extensions and for the holder's extensions. It is how long a
delivery stays out of reach after the bridge stops extending it.

Ordering keys and ``delivery_attempt`` (set when the subscription has a dead-letter policy) are
recorded on the row; rows of one ordering key are claimed in order by the store.

Stream errors: the client reconnects by itself after transient errors (``UNAVAILABLE``), so a
probe (``GetSubscription``) checks the service every ``probe_interval`` seconds; while it
fails, :meth:`PubSubConsumer.status` is ``(False, reason)``. When the stream ends with an error
(the subscription is gone, a permission was revoked, an emulator restarted), the consumer logs
why and opens a new stream with backoff. Messages received on the ended stream can no longer be
acked through it (the client library's dispatcher for it is gone): if already received they are
still written, and they come back as replays. The consumer never dies silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from google.api_core import exceptions as api_exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from bridge.config import Source, SubscriptionConfig
from bridge.decode import RawDelivery
from bridge.errors import ConfigError, FenceBridgeError
from bridge.inbox import HeldDeliveries, Inbox
from bridge.store import PostgresStore
from bridge.telemetry.propagation import producer_traceparent
from bridge.types import Key

log = logging.getLogger(__name__)

FLOW_MAX_MESSAGES_DEFAULT: Final = 1000
FLOW_MAX_BYTES_DEFAULT: Final = 100 * 1024 * 1024
MAX_LEASE_DURATION_DEFAULT: Final = 3600.0
BATCH_MAX_MESSAGES_DEFAULT: Final = 100
BATCH_MAX_WAIT_MS_DEFAULT: Final = 50
PROBE_INTERVAL_DEFAULT: Final = 10.0
#: the service's bounds for one ack deadline (seconds)
ACK_DEADLINE_MIN: Final = 10
ACK_DEADLINE_MAX: Final = 600
_BACKOFF_MAX: Final = 10.0
#: seconds a stream must have run for its end to restart the reconnect backoff
_HEALTHY_STREAM: Final = 60.0
_ACK_RETRY_PAUSE: Final = 0.5
_ACK_MODES: Final = ("after_inbox", "after_outcome")


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
    #: the stream it came from; it cannot be acked once that stream has ended
    stream: int
    received_at: float


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery kept unacknowledged until its work row's outcome (after_outcome)."""

    key: Key
    message: Any
    stream: int
    received_at: float

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
        store: PostgresStore | None = None,
        ack_mode: str = "after_inbox",
        max_messages: int = FLOW_MAX_MESSAGES_DEFAULT,
        max_bytes: int = FLOW_MAX_BYTES_DEFAULT,
        max_lease_duration: float = MAX_LEASE_DURATION_DEFAULT,
        batch_max_messages: int = BATCH_MAX_MESSAGES_DEFAULT,
        batch_max_wait_ms: int = BATCH_MAX_WAIT_MS_DEFAULT,
        writers: int = 1,
        probe_interval: float = PROBE_INTERVAL_DEFAULT,
        close_client: bool = False,
    ) -> None:
        if ack_mode not in _ACK_MODES:
            raise ValueError(f"unknown ack mode {ack_mode!r}")
        if ack_mode == "after_outcome" and store is None:
            raise ValueError("after_outcome needs the store to watch work rows")
        if writers < 1 or batch_max_messages < 1 or max_messages < 1:
            raise ValueError("writers, batch_max_messages and max_messages must be positive")
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

        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: deque[_Received] = deque()
        self._held: HeldDeliveries[Held] = HeldDeliveries()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        #: the current stream; messages of earlier streams cannot be acked any more
        self._stream = 0
        self._exactly_once = False
        self._ack_deadline = ACK_DEADLINE_MIN
        self._stream_error: str | None = "not connected yet"
        self._write_error: str | None = None
        self._future: Any = None
        #: why the current stream is being closed on purpose, if it is
        self._reopen: str | None = None
        self._closed = False

        self._supervisor = threading.Thread(
            target=self._supervise, name=f"pubsub-{subscription}-stream", daemon=True
        )
        self._writers = [
            threading.Thread(target=self._write_loop, name=f"pubsub-{subscription}-write-{i}")
            for i in range(writers)
        ]
        for t in self._writers:
            t.daemon = True
        self._holder = (
            threading.Thread(
                target=self._hold_loop, name=f"pubsub-{subscription}-hold", daemon=True
            )
            if ack_mode == "after_outcome"
            else None
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        for t in self._writers:
            t.start()
        if self._holder is not None:
            self._holder.start()
        self._supervisor.start()

    def stop(self, deadline: float = 30.0) -> None:
        """Stop receiving; messages already received are written and acknowledged.

        Messages that arrive after this are nacked; held deliveries (after_outcome) are nacked
        so another bridge gets them at once. The stream is closed last, so those acks and nacks
        still reach the service.
        """
        if self._closed:
            return
        end = time.monotonic() + deadline
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._writers:
            _join(t, end)
        with self._cond:
            leftover = list(self._pending)
            self._pending.clear()
        self._nack(leftover)
        if self._holder is not None:
            _join(self._holder, end)
            self._let_go_all()
        self._wake.set()
        _join(self._supervisor, end)
        self._closed = True
        if self._close_client:
            self._client.close()

    def status(self) -> tuple[bool, str]:
        """Ready, and why not."""
        if self._stopping.is_set():
            return True, "stopping"
        threads = [self._supervisor, *self._writers]
        if self._holder is not None:
            threads.append(self._holder)
        dead = [t.name for t in threads if t.ident is not None and not t.is_alive()]
        if dead:
            return False, f"{self.subscription}: thread {dead[0]} died"
        error = self._stream_error or self._write_error
        if error:
            return False, f"{self.subscription}: {error}"
        return True, "ok"

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
                self.counts[name] += n

    # -- the stream -------------------------------------------------------------------------------

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                future = self._open()
            except Exception as exc:  # noqa: BLE001  (any failure to open: report, retry)
                failures += 1
                self._report_stream_error(f"cannot open the subscription: {_describe(exc)}")
                self._stopping.wait(_backoff(failures))
                continue
            opened = time.monotonic()
            ended = self._watch(future)
            if ended is None:  # stopping
                future.cancel()
                try:
                    future.result(timeout=10)
                except Exception as exc:  # noqa: BLE001
                    log.info("%s: stream closed with %s", self.subscription, _describe(exc))
                return
            # A stream that ran for a while was healthy: start the backoff afresh.
            failures = 1 if time.monotonic() - opened > _HEALTHY_STREAM else failures + 1
            self._end_stream()
            self._count("reconnects")
            self._report_stream_error(f"stream ended: {ended}")
            self._stopping.wait(_backoff(failures))

    def _open(self) -> Any:
        """Read the subscription's settings and open a streaming pull with them."""
        found = self._client.get_subscription(
            request={"subscription": self._path}, retry=None, timeout=self._probe_timeout
        )
        self._exactly_once = bool(found.enable_exactly_once_delivery)
        deadline = int(found.ack_deadline_seconds) or ACK_DEADLINE_MIN
        self._ack_deadline = min(max(deadline, ACK_DEADLINE_MIN), ACK_DEADLINE_MAX)
        flow = pubsub_v1.types.FlowControl(
            max_messages=self._max_messages,
            max_bytes=self._max_bytes,
            max_lease_duration=self._max_lease,
            min_duration_per_lease_extension=self._ack_deadline,
            max_duration_per_lease_extension=self._ack_deadline,
        )
        with self._lock:
            stream = self._stream
        future = self._client.subscribe(
            self._path, callback=partial(self._on_message, stream), flow_control=flow
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
                    return _describe(exc)
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
            self._report_stream_error(f"GetSubscription failed: {_describe(exc)}")
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
            log.warning("%s: not receiving: %s", self.subscription, reason)
        self._stream_error = reason

    def _end_stream(self) -> None:
        """The stream ended: its ack ids are void; held deliveries of it will come back."""
        with self._lock:
            ended = self._stream
            self._stream += 1
        void = [h for h in self._held.snapshot() if h.stream == ended]
        self._held.forget(void)
        self._count("stream_lost", len(void))

    def _on_message(self, stream: int, message: Any) -> None:
        """The client's callback: queue only, so its threads are never blocked."""
        try:
            if self._stopping.is_set():
                message.nack()
                self._count("nacked")
                return
            item = _Received(message, to_raw(self.subscription, message), stream, time.monotonic())
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

    def _write_loop(self) -> None:
        failures = 0
        while True:
            batch = self._next_batch()
            if not batch:
                return
            try:
                ok = self._write(batch)
            except Exception:
                # Never die silently: whatever went wrong, nothing of this batch was acked.
                log.exception("%s: unexpected error in the writer", self.subscription)
                ok = False
            if ok:
                failures = 0
                continue
            failures += 1
            self._stopping.wait(_backoff(failures))

    def _next_batch(self) -> list[_Received]:
        """Wait for a batch: full, or the first message waited ``batch_max_wait_ms``."""
        with self._cond:
            while not self._pending or self._held_full():
                if self._stopping.is_set() and (not self._pending or self._held_full()):
                    return []
                self._cond.wait(timeout=1.0 if self._pending else None)
            first = self._pending[0].received_at
            while len(self._pending) < self._batch_max and not self._stopping.is_set():
                left = first + self._batch_wait - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
            take = min(len(self._pending), self._batch_max)
            return [self._pending.popleft() for _ in range(take)]

    def _held_full(self) -> bool:
        """after_outcome: held deliveries have left the client's flow control; bound them here."""
        return len(self._held) >= self._max_messages

    def _write(self, batch: list[_Received]) -> bool:
        try:
            # Raises when the transaction did not commit: nothing is acked below.
            written = self._inbox.write([r.raw for r in batch])
        except Exception as exc:  # whatever failed, nothing may be acked
            self._count("write_failed")
            self._nack(batch)
            if isinstance(exc, FenceBridgeError):  # its messages are written for logs
                self._write_error = f"inbox write failed: {exc}"
                log.warning(
                    "%s: inbox write failed (%s); %d message(s) nacked",
                    self.subscription,
                    exc,
                    len(batch),
                )
            else:
                self._write_error = "inbox write failed unexpectedly (see log)"
                log.exception(
                    "%s: unexpected error writing to the inbox; %d message(s) nacked",
                    self.subscription,
                    len(batch),
                )
            return False
        self._write_error = None
        for w in written:
            self._count(f"decision.{w.decision.value}")
        if self._ack_mode == "after_inbox":
            self._ack(self._live(batch))
            return True
        now_done: list[_Received] = []
        hold: list[Held] = []
        current = self._current_stream()
        for item, w in zip(batch, written, strict=True):
            if item.stream != current:
                self._count("stream_lost")
            elif w.awaits_outcome and w.result.key is not None:
                hold.append(Held(w.result.key, item.message, item.stream, item.received_at))
            else:
                now_done.append(item)
        self._ack(now_done)
        self._hold(hold)
        return True

    def _current_stream(self) -> int:
        with self._lock:
            return self._stream

    def _live(self, items: Sequence[_Received]) -> list[_Received]:
        """The items whose stream is still open; the others cannot be acked or nacked."""
        current = self._current_stream()
        live = [i for i in items if i.stream == current]
        self._count("stream_lost", len(items) - len(live))
        return live

    def _nack(self, items: Sequence[_Received]) -> None:
        live = self._live(items)
        for item in live:
            item.message.nack()
        self._count("nacked", len(live))

    def _ack(self, items: Sequence[_Received | Held]) -> None:
        """Ack committed deliveries; with exactly-once, wait for the service's answer."""
        if not items:
            return
        if not self._exactly_once:
            for item in items:
                item.message.ack()
                self._inbox.acked(self.subscription, item.received_at)
            self._count("acked", len(items))
            return
        give_up = time.monotonic() + self._ack_deadline
        pending = list(items)
        while pending:
            futures = [(item, item.message.ack_with_response()) for item in pending]
            retry: list[_Received | Held] = []
            for item, future in futures:
                outcome = _outcome(future, give_up)
                if outcome is AcknowledgeStatus.SUCCESS:
                    self._count("acked")
                    self._inbox.acked(self.subscription, item.received_at)
                elif outcome is AcknowledgeStatus.INVALID_ACK_ID:
                    # Expired: the service handed the message out again; that copy replays.
                    self._count("ack_id_expired")
                elif outcome is AcknowledgeStatus.OTHER:
                    retry.append(item)
                else:
                    self._count("ack_failed")
                    log.warning("%s: ack refused (%s)", self.subscription, outcome)
            if retry and time.monotonic() + _ACK_RETRY_PAUSE < give_up:
                time.sleep(_ACK_RETRY_PAUSE)
            elif retry:
                # Left to redelivery: the copy that comes back is a replay.
                self._count("ack_failed", len(retry))
                log.warning(
                    "%s: %d ack(s) failed until the ack deadline; they return as replays",
                    self.subscription,
                    len(retry),
                )
                retry = []
            pending = retry

    # -- after_outcome ----------------------------------------------------------------------------

    def held(self) -> int:
        return len(self._held)

    def _hold(self, held: Sequence[Held]) -> None:
        self._held.add(held)
        for h in held:
            # From now on the holder decides; the client must not keep it alive by itself.
            h.message.modify_ack_deadline(self._ack_deadline)
            h.message.drop()

    def _hold_loop(self) -> None:
        while not self._stopping.wait(max(self._ack_deadline / 3, 0.2)):
            try:
                self.tend_held()
            except Exception:
                log.exception("%s: could not tend held deliveries", self.subscription)

    def tend_held(self) -> None:
        """One round: ack settled, extend progressing, let go of stalled deliveries."""
        assert self._store is not None
        triage = self._held.triage(self._store, extension=self._ack_deadline, limit=self._max_lease)
        self._count("let_go", len(triage.let_go))
        current = self._current_stream()
        self._ack([h for h in triage.done if h.stream == current])
        self._extend(triage.extend)
        with self._cond:
            self._cond.notify_all()  # writers may wait for room among held deliveries

    def _extend(self, held: Sequence[Held]) -> None:
        if not held:
            return
        if not self._exactly_once:
            for h in held:
                h.message.modify_ack_deadline(self._ack_deadline)
            self._count("extended", len(held))
            return
        give_up = time.monotonic() + self._ack_deadline / 3
        futures = [
            (h, h.message.modify_ack_deadline_with_response(self._ack_deadline)) for h in held
        ]
        lost: list[Held] = []
        for h, future in futures:
            outcome = _outcome(future, give_up)
            if outcome is AcknowledgeStatus.SUCCESS:
                self._count("extended")
            elif outcome is AcknowledgeStatus.INVALID_ACK_ID:
                lost.append(h)
            else:
                log.info("%s: extension not confirmed (%s)", self.subscription, outcome)
        if lost:
            # The service no longer honours these ack ids: a redelivery will replay.
            self._held.forget(lost)
            self._count("broker_lease_lost", len(lost))

    def _let_go_all(self) -> None:
        """On stop: nack held deliveries so another bridge picks them up now."""
        held = self._held.take_all()
        current = self._current_stream()
        live = [h for h in held if h.stream == current]
        for h in live:
            h.message.nack()
        self._count("nacked", len(live))


def _outcome(future: Any, give_up: float) -> AcknowledgeStatus | str:
    """The result of an ack or modack future, waiting until ``give_up`` at most."""
    try:
        future.result(timeout=max(give_up - time.monotonic(), 0.05))
    except AcknowledgeError as exc:
        status: AcknowledgeStatus = exc.error_code
        return status
    except FutureTimeout:
        return "no answer within the ack deadline"
    except Exception as exc:  # noqa: BLE001
        return _describe(exc)
    return AcknowledgeStatus.SUCCESS


def _join(thread: threading.Thread, end: float) -> None:
    if thread.ident is not None:
        thread.join(timeout=max(end - time.monotonic(), 0))


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_MAX, 0.2 * 2**failures))


def _describe(exc: BaseException) -> str:
    """An error as a log line may show it: its kind and status, never message contents."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        code = exc.grpc_status_code
        status = code.name if code is not None else type(exc).__name__
        detail = (exc.message or "").splitlines()[0][:200] if exc.message else ""
        return f"{status} ({detail})" if detail else status
    if isinstance(exc, api_exceptions.RetryError):
        cause = exc.cause
        return f"retries exhausted ({_describe(cause)})" if cause else "retries exhausted"
    return type(exc).__name__


def from_config(config: SubscriptionConfig, inbox: Inbox, store: PostgresStore) -> PubSubConsumer:
    """The ``fencebridge.sources`` factory for ``source = "pubsub"``.

    The client library chooses the endpoint and credentials itself (``PUBSUB_EMULATOR_HOST``,
    ``GOOGLE_APPLICATION_CREDENTIALS``); the configuration holds no secret.
    """
    if config.source is not Source.PUBSUB or config.subscription is None:
        raise ConfigError(f"subscription {config.name!r} is not a Pub/Sub subscription")
    flow = config.flow_control
    return PubSubConsumer(
        pubsub_v1.SubscriberClient(),
        config.subscription,
        config.name,
        inbox,
        store=store,
        ack_mode=config.ack_mode.value,
        max_messages=flow.max_messages,
        max_bytes=flow.max_bytes,
        max_lease_duration=float(flow.max_lease_duration_seconds),
        batch_max_messages=config.batch_max_messages,
        batch_max_wait_ms=config.batch_max_wait_ms,
        writers=config.consumers,
        close_client=True,
    )
