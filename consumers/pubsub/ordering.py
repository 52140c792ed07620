"""Ingest in delivery order per ordering key, when a copy of a key leaves unwritten.

The client library hands a subscriber the messages of one ordering key one at a time: the next
only once the one before it was acked, nacked or dropped. The consumer lets a message go only
after its inbox transaction committed, so a key's rows are written in delivery order, and their
sequence numbers (drawn at insert, by whichever writer thread) follow it: the claim takes a
key's rows in that order.

Except when a message leaves *unwritten*: its write failed (nacked), the tenant backlog quota
deferred it (dropped), or it could not be queued. The library then hands over the key's next
message at once, and, without more, it would be written (and run) before the earlier one comes
back. :class:`KeyBarriers` closes the key on this consumer until the copy that left unwritten
comes back (the same message id): meanwhile every later message of the key is let go unwritten
too (dropped: it returns after its ack deadline, behind the earlier one; nacked instead, they
stalled the emulator's delivery of the key).

The earlier copy may come back to another replica instead (the service moves a key to another
stream when one ends). A closed key therefore opens again after ``ttl`` seconds (the client's
lease plus the ack deadline: by then the copy was handed out again, to this consumer or to
another one, which wrote it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class Keyed(Protocol):
    @property
    def ordering_key(self) -> str | None: ...

    @property
    def message_id(self) -> str | None: ...


K = TypeVar("K", bound=Keyed)


@dataclass(frozen=True, slots=True)
class _Closed:
    #: the message whose return opens the key again
    message_id: str | None
    #: monotonic time the key opens again whatever comes
    until: float


class KeyBarriers:
    """The ordering keys closed on this consumer, and the message each waits for."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._closed: dict[str, _Closed] = {}
        self._clock = clock

    def __len__(self) -> int:
        with self._lock:
            return len(self._closed)

    def left_unwritten(self, items: Sequence[Keyed], ttl: float) -> None:
        """These messages leave without being written: close their keys (call it *before*
        letting them go, or the library hands over the next message of the key first)."""
        until = self._clock() + ttl
        with self._lock:
            for item in items:
                key = item.ordering_key
                if key and key not in self._closed:
                    self._closed[key] = _Closed(item.message_id, until)

    def sort(self, items: Sequence[K]) -> tuple[list[K], list[K]]:
        """(to write, to let go unwritten): a message of a closed key is let go, unless it is
        the one the key waits for (or the key's wait ran out), which opens the key again."""
        write: list[K] = []
        held_back: list[K] = []
        now = self._clock()
        with self._lock:
            for item in items:
                key = item.ordering_key
                closed = self._closed.get(key) if key else None
                if closed is None:
                    write.append(item)
                elif closed.message_id == item.message_id or now >= closed.until:
                    del self._closed[key]  # type: ignore[arg-type]
                    write.append(item)
                else:
                    held_back.append(item)
        return write, held_back
