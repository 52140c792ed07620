"""A clock for the store that moves only when the test says so (``PostgresStore(clock=...)``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(2021, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    """Every statement of a store given this clock reads ``at`` instead of ``now()``."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.at = start

    def __call__(self) -> datetime:
        return self.at

    def advance(self, by: timedelta) -> None:
        self.at += by
