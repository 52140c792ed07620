"""The outbox relay: sends committed outbox messages, one relay per destination at a time.

Each destination of ``[outbox.<name>]`` gets a supervised loop in every ``fencebridge run``
process; only the one holding the destination's lease sends. The lease is a row of
``outbox_relay`` with a fence, +1 on every takeover, taken and renewed by conditional writes
from the database clock (``outbox_relay_take.sql``, ``outbox_relay_renew.sql``). A relay marks
messages sent or parked in a transaction that first locks its relay row *under its fence*
(``outbox_relay_hold.sql``); a relay that was paused past its lease and taken over finds no row
there and its marks are refused, inside the write.

What the relay can honestly promise: every committed message is sent at least once, with the id
it was written with; a message is marked sent only after its sink accepted it. It may be sent
more than once (a relay that lost its lease while sending, an answer lost on the way back): a
copy always carries the same id, and consumers deduplicate on it. Messages of one ordering key
leave in the order they were written. A message the sink refuses as invalid, or refuses more
than ``max_attempts`` times, is parked with the reason and never sent again until an operator
sends it back (``fencebridge resend``, :mod:`bridge.operator.resend`).

A send call that fails as a whole is tried again within the round with tenacity's exponential
backoff with jitter (``send_tries``); past that the round fails, the supervisor logs and counts
it, backs off and runs the next round, and the relay is unready with the reason meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import tenacity
from psycopg_pool import ConnectionPool

from bridge import sql
from bridge.adapters import sinks
from bridge.adapters.sinks import Refusal, Refused, Sink
from bridge.config.model import DestinationConfig
from bridge.database import Connection, translate_errors
from bridge.errors import RelayLost, SinkUnavailable
from bridge.outbox.publish import OutboxMessage, message_from_row
from bridge.service import IDLE, Deadline, Limits, Service, Supervised

log = logging.getLogger(__name__)

#: the bodies one round reads at most (and one message, whatever its size): with ``batch``
#: messages of up to 10 MB (Pub/Sub) a round would otherwise hold gigabytes
ROUND_BYTES: Final = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class OutboxDepth:
    """One destination's backlog, for ``fencebridge status`` and the gauges."""

    destination: str
    pending: int
    oldest_pending_seconds: float | None
    parked: int


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One message of an operation, as ``fencebridge inspect`` shows it (never its body)."""

    message_id: str
    destination: str
    state: str
    #: the fence of the run that wrote it
    fence: int
    attempts: int
    last_error: str | None
    park_reason: str | None
    created_at: datetime
    sent_at: datetime | None
    parked_at: datetime | None


class OutboxStore:
    """The outbox's statements on the bridge's pool."""

    def __init__(self, pool: ConnectionPool[Connection]) -> None:
        self._pool = pool

    @contextmanager
    def _connection(self, action: str) -> Iterator[Connection]:
        with translate_errors(action), self._pool.connection() as conn:
            yield conn

    def take(self, destination: str, owner: str, lease: timedelta) -> int | None:
        """The destination's relay lease if it is free or expired (its new fence), else None."""
        params = {"destination": destination, "owner": owner, "lease": lease}
        with self._connection("outbox relay lease") as conn:
            row = conn.execute(sql.statement("outbox_relay_take"), params).fetchone()
        return int(row[0]) if row is not None else None

    def renew(self, destination: str, fence: int, lease: timedelta) -> bool:
        params = {"destination": destination, "fence": fence, "lease": lease}
        with self._connection("outbox relay lease") as conn:
            row = conn.execute(sql.statement("outbox_relay_renew"), params).fetchone()
        return row is not None

    def release(self, destination: str, fence: int) -> None:
        params = {"destination": destination, "fence": fence}
        with self._connection("outbox relay release") as conn:
            conn.execute(sql.statement("outbox_relay_release"), params)

    def pending(
        self, destination: str, limit: int, max_bytes: int = ROUND_BYTES
    ) -> list[OutboxMessage]:
        """The next pending messages in the order written: at most ``limit``, and none past
        ``max_bytes`` of bodies but the first."""
        params = {"destination": destination, "limit": limit, "max_bytes": max_bytes}
        with self._connection("outbox read") as conn:
            rows = conn.execute(sql.statement("outbox_pending"), params).fetchall()
        return [message_from_row(r) for r in rows]

    def mark(
        self,
        destination: str,
        fence: int,
        *,
        sent: Sequence[str] = (),
        failed: Mapping[str, Sequence[str]] | None = None,
        invalid: Mapping[str, Sequence[str]] | None = None,
        max_attempts: int,
    ) -> tuple[int, int]:
        """Mark under the relay's fence, in one transaction: sent, failed (by reason) and
        invalid (by reason, parked). Raises :class:`RelayLost` if the fence moved on.
        Returns (marked sent, parked)."""
        base = {"destination": destination, "fence": fence}
        parked = 0
        with self._connection("outbox mark") as conn, conn.transaction():
            if conn.execute(sql.statement("outbox_relay_hold"), base).fetchone() is None:
                raise RelayLost(f"outbox relay of {destination!r}: the lease moved on")
            done = 0
            if sent:
                rows = conn.execute(
                    sql.statement("outbox_sent"), {**base, "ids": list(sent)}
                ).fetchall()
                done = len(rows)
            for reason, ids in (failed or {}).items():
                rows = conn.execute(
                    sql.statement("outbox_failed"),
                    {**base, "ids": list(ids), "error": reason, "max_attempts": max_attempts},
                ).fetchall()
                parked += sum(1 for _, state in rows if state == "parked")
            for reason, ids in (invalid or {}).items():
                rows = conn.execute(
                    sql.statement("outbox_park"), {**base, "ids": list(ids), "reason": reason}
                ).fetchall()
                parked += len(rows)
        return done, parked

    def of_operation(self, tenant_id: str, operation_id: str) -> list[OutboxRecord]:
        params = {"tenant_id": tenant_id, "operation_id": operation_id}
        with self._connection("outbox read") as conn:
            rows = conn.execute(sql.statement("outbox_operation"), params).fetchall()
        return [OutboxRecord(*row) for row in rows]

    def depth(self) -> list[OutboxDepth]:
        with self._connection("outbox stats") as conn:
            rows = conn.execute(sql.statement("outbox_stats")).fetchall()
        return [
            OutboxDepth(d, int(p), float(age) if age is not None else None, int(k))
            for d, p, age, k in rows
        ]

    def purge_preview(self, older_than: timedelta) -> int:
        """How many sent messages a purge with this age would remove right now."""
        params = {"older_than": older_than, "now": None}
        with self._connection("outbox purge") as conn:
            row = conn.execute(sql.statement("outbox_purge_count"), params).fetchone()
        return int(row[0]) if row is not None else 0

    def purge(self, older_than: timedelta, batch_size: int) -> int:
        """Remove every message sent before ``older_than``, one bounded batch at a time."""
        removed = 0
        while True:
            gone = self.purge_batch(older_than, batch_size)
            removed += gone
            if gone < batch_size:
                return removed

    def purge_batch(self, older_than: timedelta, limit: int) -> int:
        """Remove one bounded batch of messages sent before ``older_than``; how many."""
        params = {"older_than": older_than, "limit": limit, "now": None}
        with self._connection("outbox purge") as conn, conn.transaction():
            return len(conn.execute(sql.statement("outbox_purge"), params).fetchall())


class DestinationRelay:
    """The relay loop of one destination in this process (sends only while it holds the lease)."""

    def __init__(
        self,
        name: str,
        config: DestinationConfig,
        store: OutboxStore,
        sink: Sink,
        *,
        owner: str,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
        on_sent: Callable[[str, int], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._store = store
        self._sink = sink
        self._owner = owner
        self._lease = timedelta(seconds=config.lease_seconds)
        self._on_sent = on_sent
        self._stop = threading.Event()
        #: the relay fence this process holds, None while another process relays
        self.fence: int | None = None
        self.sent_total = 0
        self.parked_total = 0
        self.service = Supervised(
            f"outbox:{name}",
            self.round,
            stop=self._stop,
            label="outbox-relay",
            limits=limits,
            on_restart=on_restart,
            after=self._release,
            idle_clears_after=config.poll_interval_seconds * 2,
        )

    def round(self) -> object:
        """Hold the lease, send a batch, mark it; an idle round waits the poll interval."""
        if not self._hold():
            self._stop.wait(self.config.poll_interval_seconds)
            return IDLE
        fence = self.fence
        assert fence is not None
        batch = self._store.pending(self.name, self.config.batch)
        if not batch:
            self._stop.wait(self.config.poll_interval_seconds)
            return IDLE
        refused = self._send(batch)
        sent = [m.message_id for m in batch if m.message_id not in refused]
        failed: dict[str, list[str]] = defaultdict(list)
        invalid: dict[str, list[str]] = defaultdict(list)
        for message_id, refusal in refused.items():
            if refusal.kind is Refusal.RETRY:
                failed[refusal.reason].append(message_id)
            elif refusal.kind is Refusal.INVALID:
                invalid[refusal.reason].append(message_id)
        try:
            done, parked = self._store.mark(
                self.name,
                fence,
                sent=sent,
                failed=failed,
                invalid=invalid,
                max_attempts=self.config.max_attempts,
            )
        except RelayLost:
            log.warning("outbox relay %s: lease lost; its marks were refused", self.name)
            self.fence = None
            return None
        self.sent_total += done
        self.parked_total += parked
        if parked:
            log.warning("outbox relay %s: parked %d message(s)", self.name, parked)
        if self._on_sent is not None and done:
            self._on_sent(self.name, done)
        return None

    def _hold(self) -> bool:
        if self.fence is not None:
            if self._store.renew(self.name, self.fence, self._lease):
                return True
            log.warning("outbox relay %s: taken over by another process", self.name)
            self.fence = None
        self.fence = self._store.take(self.name, self._owner, self._lease)
        if self.fence is not None:
            log.info("outbox relay %s: relaying under fence %d", self.name, self.fence)
        return self.fence is not None

    def _send(self, batch: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(SinkUnavailable),
            wait=tenacity.wait_random_exponential(
                multiplier=self.config.retry_initial_seconds, max=self.config.retry_max_seconds
            ),
            stop=tenacity.stop_after_attempt(self.config.send_tries),
            sleep=self._pause,
            reraise=True,
        )
        return retrying(self._sink.send, batch)

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _release(self) -> None:
        """On stop: give the lease back so another process takes over at once."""
        fence, self.fence = self.fence, None
        try:
            if fence is not None:
                self._store.release(self.name, fence)
        finally:
            self._sink.close()


class Relay:
    """Every destination's relay loop in this process."""

    def __init__(
        self,
        store: OutboxStore,
        destinations: Mapping[str, DestinationConfig],
        *,
        owner: str,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
        open_sink: Callable[[str, DestinationConfig], Sink] | None = None,
    ) -> None:
        self.store = store

        def opened(name: str, config: DestinationConfig) -> Sink:
            if open_sink is not None:
                return open_sink(name, config)
            return sinks.adapter(config.sink).open(name, config)

        self.destinations = [
            DestinationRelay(
                name,
                config,
                store,
                opened(name, config),
                owner=owner,
                limits=limits,
                on_restart=on_restart,
            )
            for name, config in destinations.items()
        ]

    def services(self) -> list[Service]:
        return [d.service for d in self.destinations]

    def start(self) -> None:
        for d in self.destinations:
            d.service.start()

    def stop(self, deadline: float | Deadline = 10.0) -> None:
        until = Deadline.of(deadline)
        for d in self.destinations:
            d.service.signal_stop()
        for d in self.destinations:
            d.service.join(until)
