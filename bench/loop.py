"""The pool's statements driven by a bare Python loop: how far the pool is from its own SQL.

``bench.workers`` drains with this beside the pool (system ``loop``): the same store, opened
the same way, the same claim (tenant-fair) and ``settle_many`` statements, the same worker
threads fed through a queue, but none of the pool's machinery: no executor, no heartbeats,
no events, no telemetry, no linger. A claimer claims for its threads, hands each row over,
waits until every one has come back, and claims again. Two shapes of a round:

* ``beside``: the settlements of the last rows are written on a second connection while the
  claim for their workers runs, as the pool writes them (up to twice the threads in flight
  for a moment);
* ``within``: the settlements and the claim in one transaction on one connection, so the rows
  held change at one commit and never exceed the threads.

This is not a worker tier (nothing renews a lease, nothing reports a run): it measures what a
Python process with this many threads can get out of these statements on this server, so that
the benchmark shows how much of the gap to the peers and to the pgbench ceiling is the pool's.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from bridge.database import Connection
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Claim, State

BESIDE, WITHIN = "beside", "within"
SHAPES = (BESIDE, WITHIN)
LEASE = timedelta(minutes=5)
#: a claim for a thread, the list its settlement joins, and the condition that tells the claimer
Work = tuple[Claim, list[Settlement], threading.Condition] | None


class PinnedStore(PostgresStore):
    """A store whose calls in one thread can share one connection's transaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pinned = threading.local()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.pool.connection() as conn, conn.transaction():
            self._pinned.conn = conn
            try:
                yield
            finally:
                self._pinned.conn = None

    @contextmanager
    def connection(self, action: str) -> Iterator[Connection]:
        conn: Connection | None = getattr(self._pinned, "conn", None)
        if conn is not None:
            yield conn
        else:
            with super().connection(action) as borrowed:
                yield borrowed


def drain(store: PinnedStore, threads: int, claimers: int, shape: str) -> None:
    """Drain the queue with ``claimers`` loops of ``threads // claimers`` threads each."""
    if shape not in SHAPES:
        raise ValueError(f"a round's shape is one of {SHAPES}, not {shape!r}")
    per = max(1, threads // claimers)
    loops = [
        threading.Thread(target=_claimer, args=(store, f"loop-{i}", per, shape), daemon=True)
        for i in range(claimers)
    ]
    for loop in loops:
        loop.start()
    for loop in loops:
        loop.join()


def _claimer(store: PinnedStore, worker: str, threads: int, shape: str) -> None:
    work: queue.Queue[Work] = queue.Queue()
    handlers = [
        threading.Thread(target=_handler, args=(work,), daemon=True) for _ in range(threads)
    ]
    for handler in handlers:
        handler.start()
    settler = ThreadPoolExecutor(1)
    settled: list[Settlement] = []
    try:
        while True:
            if shape == WITHIN:
                with store.transaction():
                    if settled:
                        store.settle.settle_many(settled)
                    claims = store.claims.claim(worker, threads, LEASE)
            else:
                written = settler.submit(store.settle.settle_many, settled) if settled else None
                claims = store.claims.claim(worker, threads, LEASE)
                if written is not None:
                    written.result()
            if not claims:
                if shape == WITHIN or not settled:
                    return
                settled = []
                continue
            settled = _run(work, claims)
    finally:
        for _ in handlers:
            work.put(None)
        settler.shutdown()


def _run(work: queue.Queue[Work], claims: list[Claim]) -> list[Settlement]:
    """Hand each claim to a thread; the settlements once every one has come back."""
    settled: list[Settlement] = []
    answered = threading.Condition()
    for claim in claims:
        work.put((claim, settled, answered))
    with answered:
        answered.wait_for(lambda: len(settled) == len(claims))
    return settled


def _handler(work: queue.Queue[Work]) -> None:
    while (item := work.get()) is not None:
        claim, settled, answered = item
        with answered:
            settled.append(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
            answered.notify()
