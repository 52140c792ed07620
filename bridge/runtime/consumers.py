"""Every subscription's consumer as one stage of the bridge.

Consumers stop all at once, not one after another: each stops receiving, writes and
acknowledges what it already received, and gets what is left of the one deadline, so a slow
broker on one subscription does not eat the time of the others. The stage is a service like
every other part of the process (start, and stop by a deadline); each consumer's own loops
are reported by :meth:`services`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from bridge.adapters.sources import Consumer
from bridge.service import Deadline, Service, describe

log = logging.getLogger(__name__)


class Consumers:
    """The consumers of one process, started together and stopped together."""

    name = "consumers"

    def __init__(self, consumers: Sequence[Consumer]) -> None:
        self.members = list(consumers)

    def start(self) -> None:
        for consumer in self.members:
            consumer.start()

    def stop(self, deadline: float | Deadline = 30.0) -> bool:
        """Tell every consumer at once; whether all stopped within the deadline."""
        until = Deadline.of(deadline)
        stopping = [
            threading.Thread(
                target=self._stop_one,
                args=(consumer, until),
                name=f"fencebridge-stop-{consumer.subscription}",
                daemon=True,
            )
            for consumer in self.members
        ]
        for t in stopping:
            t.start()
        for t in stopping:
            t.join(timeout=until.remaining())
        late = [t.name for t in stopping if t.is_alive()]
        if late:
            log.warning("%d consumer(s) still stopping at the deadline", len(late))
        return not late

    @staticmethod
    def _stop_one(consumer: Consumer, until: Deadline) -> None:
        try:
            consumer.stop(until.remaining())
        except Exception as exc:  # noqa: BLE001  (the others and the pool still stop)
            log.warning("%s did not stop cleanly (%s)", consumer.subscription, describe(exc))

    def services(self) -> list[Service]:
        return [s for consumer in self.members for s in consumer.services()]
