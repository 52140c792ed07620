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
sends it back (``fencebridge resend``, :meth:`bridge.store.outbox.OutboxStore.resend`).

A send call that fails as a whole is tried again within the round with tenacity's exponential
backoff with jitter (``send_tries``); past that the round fails, the supervisor logs and counts
it, backs off and runs the next round, and the relay is unready with the reason meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

import tenacity

from bridge.adapters import sinks
from bridge.adapters.sinks import Refusal, Refused, Sink
from bridge.config.model import DestinationConfig
from bridge.errors import RelayLost, SinkUnavailable
from bridge.outbox.publish import OutboxMessage
from bridge.service import IDLE, Deadline, Limits, Service, Supervised
from bridge.store.outbox import OutboxStore

log = logging.getLogger(__name__)


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
