"""A broker adapter kept in this process's memory: the smallest complete adapter.

It is everything a new broker needs, in one module: its subscription keys (a
:class:`~bridge.adapters.sources.SourceSettings`), its consumer and its :data:`ADAPTER`, which a
distribution registers under the ``fencebridge.sources`` entry point. Nothing in ``bridge/``
knows it: :func:`register` writes the metadata of a distribution that declares it, the way
an installed third-party package would, and the core finds it there.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import Field, StrictInt

from bridge.adapters.kit import (
    IDLE,
    Backoff,
    Deadline,
    Inbox,
    Name,
    RowWatch,
    Service,
    SourceAdapter,
    SourceSettings,
    SubscriptionConfig,
    stream_status,
)
from bridge.types import RawDelivery

SOURCE: Final = "memory"
#: the entry-point group the core finds sources in, as a distribution's metadata names it
ENTRY_POINT_GROUP: Final = "fencebridge.sources"
DISTRIBUTION: Final = "fencebridge-memory-source"


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    body: bytes
    attributes: dict[str, str]


class MemoryQueue:
    """Messages are taken (in flight), then acknowledged or released back."""

    def __init__(self) -> None:
        self._ready: deque[Message] = deque()
        self._in_flight: dict[str, Message] = {}
        self._sent = 0
        self._changed = threading.Condition()

    def publish(self, body: bytes, attributes: dict[str, str]) -> str:
        with self._changed:
            self._sent += 1
            message = Message(f"m-{self._sent}", body, attributes)
            self._ready.append(message)
            self._changed.notify_all()
            return message.message_id

    def take(self, n: int, wait: float) -> list[Message]:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._ready), timeout=wait)
            taken = [self._ready.popleft() for _ in range(min(n, len(self._ready)))]
            self._in_flight.update((m.message_id, m) for m in taken)
            return taken

    def ack(self, ids: Sequence[str]) -> None:
        with self._changed:
            for i in ids:
                del self._in_flight[i]

    def release(self, ids: Sequence[str]) -> None:
        with self._changed:
            self._ready.extendleft(self._in_flight.pop(i) for i in reversed(ids))
            self._changed.notify_all()

    def deliverable(self) -> int:
        with self._changed:
            return len(self._ready) + len(self._in_flight)


QUEUES: dict[str, MemoryQueue] = {}


def queue(name: str) -> MemoryQueue:
    return QUEUES.setdefault(name, MemoryQueue())


class MemorySettings(SourceSettings):
    """A queue in the bridge's own memory, for tests."""

    queue: Name = Field(description="The queue's name.")
    receive_batch: StrictInt = Field(
        default=10, ge=1, le=100, description="Messages taken per receive."
    )
    wait_ms: StrictInt = Field(
        default=200, ge=1, le=10_000, description="Longest a receive waits for a message."
    )


class MemoryConsumer:
    """Takes a batch, writes it through the inbox, acknowledges it once that committed."""

    def __init__(
        self, source: MemoryQueue, subscription: str, inbox: Inbox, *, batch: int, wait: float
    ) -> None:
        self.subscription = subscription
        self._queue = source
        self._inbox = inbox
        self._batch = batch
        self._wait = wait
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._receiver = inbox.supervised(
            f"memory:{subscription}:receive",
            self._turn,
            label="memory_receiver",
            stop=self._stop,
            backoff=Backoff(initial=0.05, cap=0.5),
            thread_name=f"memory-{subscription}",
        )

    @property
    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    def start(self) -> None:
        self._receiver.start()

    def stop(self, deadline: float = 30.0) -> None:
        self._stop.set()
        self._receiver.join(Deadline(deadline))

    def status(self) -> tuple[bool, str]:
        return stream_status(
            self.subscription,
            [self._receiver],
            None,
            holder=None,
            counts=self.counts,
            shown=("received", "acked"),
        )

    def services(self) -> Sequence[Service]:
        return [self._receiver]

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _turn(self) -> str | None:
        messages = self._queue.take(self._batch, self._wait)
        if not messages:
            return IDLE
        ids = [m.message_id for m in messages]
        self._count("received", len(messages))
        try:
            written = self._inbox.write(
                [
                    RawDelivery(
                        subscription=self.subscription,
                        message_id=m.message_id,
                        body=m.body,
                        attributes=m.attributes,
                    )
                    for m in messages
                ]
            )
        except BaseException:
            self._queue.release(ids)  # not committed: nothing is acknowledged
            raise
        for w in written:
            self._count(f"decision.{w.decision.value}")
        self._queue.ack(ids)
        self._count("acked", len(ids))
        return None


def open_consumer(sub: SubscriptionConfig, inbox: Inbox, _store: RowWatch) -> MemoryConsumer:
    settings = MemorySettings.of(sub)
    return MemoryConsumer(
        queue(settings.queue),
        sub.name,
        inbox,
        batch=settings.receive_batch,
        wait=settings.wait_ms / 1000,
    )


ADAPTER: Final = SourceAdapter(
    settings=MemorySettings,
    open=open_consumer,
    messaging_system="memory",
    redelivery_days=0,
)


def register(directory: Path) -> Path:
    """Write the metadata of a distribution that registers this adapter; put ``directory`` on
    ``sys.path`` (or ``PYTHONPATH``) and the core finds ``source = "memory"``."""
    info = directory / f"{DISTRIBUTION.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{SOURCE} = {__name__}:ADAPTER\n"
    )
    return directory
