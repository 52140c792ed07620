"""The purge loop against a fake store with only ``purge_batch``, the one method of the operator
interface that :func:`~bridge.operator.purge.purge` calls. The statements themselves are tested on
PostgreSQL (``tests/integration/test_operations.py``, ``tests/acceptance/test_cli_operations.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from bridge.operator.purge import PurgeReport, purge
from bridge.store.records import PurgeCounts

AGE = timedelta(days=30)


class Batches:
    """Answers each ``purge_batch`` with the next scripted batch (None: another purge runs)."""

    def __init__(self, batches: Iterable[PurgeCounts | None]) -> None:
        self._batches = iter(batches)
        self.asked: list[tuple[timedelta, int]] = []

    def purge_batch(
        self, older_than: timedelta, limit: int, *, tombstone_horizon: timedelta
    ) -> PurgeCounts | None:
        self.asked.append((older_than, limit))
        return next(self._batches)


def test_purge_goes_on_while_batches_come_back_full_and_adds_them_up() -> None:
    store = Batches([PurgeCounts(2, 0, 2), PurgeCounts(1, 2, 3), PurgeCounts(1, 1, 1)])
    report = purge(store, AGE, batch_size=2)
    assert report == PurgeReport(PurgeCounts(4, 3, 6), batches=3, locked_out=False)
    assert store.asked == [(AGE, 2)] * 3


def test_purge_stops_when_another_purge_holds_the_lock_and_keeps_what_it_removed() -> None:
    store = Batches([PurgeCounts(2, 2, 4), None, PurgeCounts(1, 1, 1)])
    report = purge(store, AGE, batch_size=2)
    assert report == PurgeReport(PurgeCounts(2, 2, 4), batches=1, locked_out=True)
    assert len(store.asked) == 2
