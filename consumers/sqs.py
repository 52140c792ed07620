"""SQS consumer: long-poll, one inbox transaction per received batch, then delete.

``after_inbox`` (default): every delivery the database now holds (new, replay, conflict,
quarantined) is deleted with ``DeleteMessageBatch`` right after COMMIT; the broker was only a
wake-up signal. If the transaction fails nothing is deleted, and the messages come back when
their visibility timeout ends.

``after_outcome``: deliveries with a work row are held. A holder thread watches the rows and,
every third of the visibility timeout, extends the visibility of those still queued or whose
claim's lease is live (renewed by handler progress), deletes those whose row is terminal or
parked, and lets go of those whose claim stalled, so the broker redelivers them (a replay). A
rejected extension — a stale receipt handle after a redelivery, a message no longer in flight —
is a lost broker lease: the handle is dropped and counted, nothing crashes. Visibility is never
extended past twelve hours from the receive (the SQS limit); the message is then left to return.

FIFO queues: the message group becomes the row's ordering key, so a group's next row is not
claimed before the previous one settles. ``ApproximateReceiveCount`` is recorded on the row.
Binary message attributes are not used for decoding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from bridge.config import SubscriptionConfig
from bridge.decode import RawDelivery
from bridge.errors import BrokerUnavailable, ConfigError, FenceBridgeError
from bridge.inbox import HeldDeliveries, Inbox
from bridge.store import PostgresStore
from bridge.telemetry.propagation import producer_traceparent
from bridge.types import Key

log = logging.getLogger(__name__)

RECEIVE_BATCH_DEFAULT = 10
WAIT_SECONDS_DEFAULT = 20
VISIBILITY_TIMEOUT_DEFAULT = 60
MAX_VISIBILITY_SECONDS = 12 * 3600
_LEASE_LOST_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "InvalidParameterValue",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)
_BACKOFF_MAX = 10.0


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery kept in flight until its work row's outcome (after_outcome)."""

    key: Key
    #: the receipt handle of this copy
    handle: str
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
        store: PostgresStore | None = None,
        ack_mode: str = "after_inbox",
        receive_batch: int = RECEIVE_BATCH_DEFAULT,
        wait_seconds: int = WAIT_SECONDS_DEFAULT,
        visibility_timeout: int = VISIBILITY_TIMEOUT_DEFAULT,
        threads: int = 1,
    ) -> None:
        if ack_mode not in ("after_inbox", "after_outcome"):
            raise ValueError(f"unknown ack mode {ack_mode!r}")
        if ack_mode == "after_outcome" and store is None:
            raise ValueError("after_outcome needs the store to watch work rows")
        self._client = client
        self._queue_url = queue_url
        self.subscription = subscription
        self._inbox = inbox
        self._store = store
        self._ack_mode = ack_mode
        self._batch = receive_batch
        self._wait = wait_seconds
        self._visibility = visibility_timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: HeldDeliveries[Held] = HeldDeliveries()
        self.counts: Counter[str] = Counter()
        self._error: str | None = None
        self._receivers = [
            threading.Thread(target=self._receive_loop, name=f"sqs-{subscription}-{i}", daemon=True)
            for i in range(threads)
        ]
        self._holder = (
            threading.Thread(target=self._hold_loop, name=f"sqs-{subscription}-hold", daemon=True)
            if ack_mode == "after_outcome"
            else None
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        for t in self._receivers:
            t.start()
        if self._holder is not None:
            self._holder.start()

    def stop(self, deadline: float = 30.0) -> None:
        """Stop receiving; a receive in progress finishes (and is written and acked)."""
        end = time.monotonic() + deadline
        self._stop.set()
        for t in self._receivers:
            t.join(timeout=max(end - time.monotonic(), 0))
        if self._holder is not None:
            self._holder.join(timeout=max(end - time.monotonic(), 0))
            self._let_go_all()

    def status(self) -> tuple[bool, str]:
        """Ready, and why not."""
        alive = all(t.is_alive() for t in self._receivers) or self._stop.is_set()
        if not alive:
            return False, f"{self.subscription}: a receiver thread died"
        if self._error:
            return False, f"{self.subscription}: {self._error}"
        return True, "ok"

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    # -- receiving --------------------------------------------------------------------------------

    def _receive(self) -> list[dict[str, Any]]:
        try:
            response = self._client.receive_message(
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=self._batch,
                WaitTimeSeconds=self._wait,
                # The visibility this consumer is configured for, not the queue's default: an
                # after_outcome hold extends every third of it, and must start from it.
                VisibilityTimeout=self._visibility,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        except (BotoCoreError, ClientError) as exc:
            raise BrokerUnavailable(f"receive from SQS failed: {_describe(exc)}") from exc
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    def _receive_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                messages = self._receive()
                if messages:
                    self._process(messages)
            except FenceBridgeError as exc:
                failures += 1
                self._error = str(exc)
                pause = min(_BACKOFF_MAX, 0.2 * 2**failures)
                log.warning("%s: %s; retrying in %.1fs", self.subscription, exc, pause)
                self._stop.wait(pause)
                continue
            except Exception:
                # Never die silently: log, report not-ready, keep the loop alive.
                failures += 1
                self._error = "unexpected error in the receive loop (see log)"
                log.exception("%s: unexpected error in the receive loop", self.subscription)
                self._stop.wait(min(_BACKOFF_MAX, 0.2 * 2**failures))
                continue
            failures = 0
            self._error = None

    def _process(self, messages: list[dict[str, Any]]) -> None:
        received_at = time.monotonic()
        self._count("received", len(messages))
        raws = [to_raw(self.subscription, m) for m in messages]
        # Raises when the transaction did not commit: nothing is deleted below.
        written = self._inbox.write(raws)
        for w in written:
            self._count(f"decision.{w.decision.value}")
        handles = [m["ReceiptHandle"] for m in messages]
        if self._ack_mode == "after_inbox":
            self._delete(dict.fromkeys(handles, received_at))
            return
        hold: list[Held] = []
        now_done: dict[str, float] = {}
        for handle, w in zip(handles, written, strict=True):
            if w.awaits_outcome and w.result.key is not None:
                hold.append(Held(w.result.key, handle, received_at))
            else:
                now_done[handle] = received_at
        self._held.add(hold)
        self._delete(now_done)

    def _delete(self, handles: Mapping[str, float]) -> None:
        """Delete in batches of ten: receipt handle -> its receive time, for the ack latency."""
        for chunk in _chunks(list(handles), 10):
            entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)]
            try:
                response = self._client.delete_message_batch(
                    QueueUrl=self._queue_url, Entries=entries
                )
            except (BotoCoreError, ClientError) as exc:
                # Committed but not deleted: the messages come back as replays.
                self._count("delete_failed", len(chunk))
                log.warning("%s: delete failed (%s)", self.subscription, _describe(exc))
                continue
            successful = response.get("Successful", [])
            self._count("deleted", len(successful))
            for entry in successful:
                self._inbox.acked(self.subscription, handles[chunk[int(entry["Id"])]])
            failed = response.get("Failed", [])
            if failed:
                self._count("delete_failed", len(failed))
                log.warning(
                    "%s: %d deletes failed (%s); they return as replays",
                    self.subscription,
                    len(failed),
                    ",".join(sorted({f.get("Code", "?") for f in failed})),
                )

    # -- after_outcome ----------------------------------------------------------------------------

    def held(self) -> int:
        return len(self._held)

    def _hold_loop(self) -> None:
        period = max(self._visibility / 3, 0.2)
        while not self._stop.wait(period):
            try:
                self.tend_held()
            except FenceBridgeError as exc:
                log.warning("%s: could not tend held deliveries: %s", self.subscription, exc)
            except Exception:
                log.exception("%s: unexpected error tending held deliveries", self.subscription)

    def tend_held(self) -> None:
        """One round: delete settled, extend progressing, let go of stalled deliveries."""
        assert self._store is not None
        triage = self._held.triage(
            self._store,
            extension=self._visibility,
            limit=MAX_VISIBILITY_SECONDS - 60,  # SQS counts twelve hours from the receive
        )
        self._delete({h.handle: h.received_at for h in triage.done})
        if triage.let_go:
            self._count("let_go", len(triage.let_go))
        self._extend(triage.extend)

    def _extend(self, held: Sequence[Held]) -> None:
        for chunk in _chunks(held, 10):
            entries = [
                {
                    "Id": str(i),
                    "ReceiptHandle": h.handle,
                    "VisibilityTimeout": self._visibility,
                }
                for i, h in enumerate(chunk)
            ]
            try:
                response = self._client.change_message_visibility_batch(
                    QueueUrl=self._queue_url, Entries=entries
                )
            except ClientError as exc:
                if _error_code(exc) in _LEASE_LOST_CODES:
                    self._broker_lease_lost(chunk)
                    continue
                log.warning("%s: extension failed (%s)", self.subscription, _describe(exc))
                continue
            except BotoCoreError as exc:
                log.warning("%s: extension failed (%s)", self.subscription, _describe(exc))
                continue
            self._count("extended", len(response.get("Successful", [])))
            lost = [
                chunk[int(f["Id"])]
                for f in response.get("Failed", [])
                if f.get("Code") in _LEASE_LOST_CODES
            ]
            if lost:
                self._broker_lease_lost(lost)

    def _broker_lease_lost(self, held: Sequence[Held]) -> None:
        """The broker no longer honours these handles: drop them; a redelivery will replay."""
        self._held.forget(held)
        self._count("broker_lease_lost", len(held))
        log.info("%s: %d broker lease(s) lost", self.subscription, len(held))

    def _let_go_all(self) -> None:
        """On stop: make held messages visible again now, so another bridge picks them up."""
        for chunk in _chunks(self._held.take_all(), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": h.handle, "VisibilityTimeout": 0}
                for i, h in enumerate(chunk)
            ]
            try:
                self._client.change_message_visibility_batch(
                    QueueUrl=self._queue_url, Entries=entries
                )
            except (BotoCoreError, ClientError) as exc:
                log.info(
                    "%s: could not release held messages (%s)", self.subscription, _describe(exc)
                )


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return _error_code(exc) or type(exc).__name__
    return type(exc).__name__


def from_config(sub: SubscriptionConfig, inbox: Inbox, store: PostgresStore) -> SqsConsumer:
    """The ``sqs`` source: a boto3 client for the queue's region (and endpoint, if local)."""
    import boto3  # noqa: PLC0415  (only when an SQS subscription is configured)
    from botocore.config import Config  # noqa: PLC0415

    if sub.queue_url is None:  # the configuration requires it; this guards direct use
        raise ConfigError(f"subscriptions.{sub.name}.queue_url is required for source sqs")
    client = boto3.session.Session().client(
        "sqs",
        region_name=sub.region,
        endpoint_url=sub.endpoint_url,
        # The long poll must finish before the read times out.
        config=Config(read_timeout=sub.wait_seconds + 10, retries={"mode": "standard"}),
    )
    return SqsConsumer(
        client,
        sub.queue_url,
        sub.name,
        inbox,
        store=store,
        ack_mode=sub.ack_mode.value,
        receive_batch=sub.receive_batch,
        wait_seconds=sub.wait_seconds,
        visibility_timeout=sub.visibility_timeout_seconds,
        threads=sub.consumers,
    )
