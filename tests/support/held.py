"""The rows a pool holds, sampled all along from a session of its own."""

from __future__ import annotations

import threading
from types import TracebackType

import psycopg


class HeldRows:
    """Samples the claimed rows, as (operation, fence), until the ``with`` block ends."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="held-rows")
        self.samples: list[list[tuple[str, int]]] = []

    def __enter__(self) -> HeldRows:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def most(self, besides: set[tuple[str, int]]) -> int:
        """The most rows held at once, not counting ``besides`` (claims nobody holds, such as
        those of a write whose commit was cut)."""
        return max(len(set(rows) - besides) for rows in self.samples)

    def _sample(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT operation_id, fence FROM work_item WHERE state = 'claimed'"
                ).fetchall()
                self.samples.append([(op, int(fence)) for op, fence in rows])
