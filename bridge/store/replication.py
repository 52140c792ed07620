"""Waiting until a commit is on the standby, for subscriptions that ask (``wait_for_standby``).

With asynchronous replication a failover loses the commits the promoted standby had not
received, each of which its client was told had committed. Two of those commits are promises
to somebody outside the database: the inbox commit after which the broker message is
acknowledged (the broker deletes it; nothing redelivers it) and a class D intent after which
the target is called (the next claim on the promoted server would not see it and call again).
A subscription with ``wait_for_standby`` makes both wait until a standby has **flushed** the
WAL they are in: the position is read after the commit (``standby_position.sql``) and compared
with every standby's ``flush_lsn`` (``standby_flushed.sql``) until one has it, within the
subscription's ``wait_for_standby_seconds``. The position is read on the server this
thread's commit went to: when the wait's connection reaches another one (the URL names the
primary and its standbys, and a failover came between the commit and the wait), nothing is
confirmed, since the promoted server may lack the commit while its own standby has flushed
everything it has. Under synchronous replication the commit itself
waited, so the first look confirms it; the look still matters there, since a commit whose wait
for the synchronous standby was cancelled returns as committed all the same.

A wait that runs out raises :class:`StandbyNotConfirmed` (a :class:`StoreUnavailable`): the
consumer acknowledges nothing of the batch (the broker redelivers it, a replay, which waits
again), and a class D run gives its row back with the intent withdrawn and the attempt not
counted (``withdraw_intent.sql``, :meth:`bridge.store.settle.SettleStore.withdraw_intent`),
without calling. Every wait is recorded in
``fencebridge.standby_wait.duration``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final, Literal, Protocol

from bridge import sql
from bridge.errors import StandbyNotConfirmed
from bridge.store.db import Database, server_of

#: what waited: the broker acknowledgement of an inbox batch, or a class D call
Purpose = Literal["ack", "intent"]
#: first pause between two looks at the standby's position; doubles up to POLL_MAX
POLL_FIRST: Final = 0.002
POLL_MAX: Final = 0.05

#: (subscription, purpose, seconds waited, confirmed)
Observer = Callable[[str, Purpose, float, bool], None]


class StandbyGate(Protocol):
    """What the inbox and the class D executor ask of :class:`StandbyWait`."""

    def applies(self, subscription: str) -> bool: ...

    def wait(self, subscription: str, purpose: Purpose) -> float: ...


class StandbyWait:
    """The standby waits of the subscriptions that ask for them, on the bridge's database."""

    def __init__(
        self,
        db: Database,
        seconds: Mapping[str, float],
        *,
        observe: Observer | None = None,
    ) -> None:
        self._db = db
        #: subscription -> its wait's bound, for the subscriptions with ``wait_for_standby``
        self._seconds = dict(seconds)
        self._observe = observe

    def applies(self, subscription: str) -> bool:
        return subscription in self._seconds

    def wait(self, subscription: str, purpose: Purpose) -> float:
        """Return once a standby has flushed every commit made before this call (seconds
        waited); raise :class:`StandbyNotConfirmed` when none has within the bound."""
        bound = self._seconds[subscription]
        began = time.monotonic()
        deadline = began + bound
        confirmed = False
        committed_on = self._db.last_server()
        try:
            with self._db.connection("standby wait") as conn:
                if committed_on is not None and server_of(conn) != committed_on:
                    # A failover between the commit and this wait: the server answering now
                    # may lack the commit, and its position and standbys say nothing of it.
                    raise StandbyNotConfirmed(
                        "the server that took the commit no longer answers (a failover?)"
                    )
                row = conn.execute(sql.statement("standby_position")).fetchone()
                assert row is not None
                lsn = row[0]
                pause = POLL_FIRST
                while True:
                    found = conn.execute(sql.statement("standby_flushed"), {"lsn": lsn}).fetchone()
                    assert found is not None
                    if found[0] > 0:
                        confirmed = True
                        return time.monotonic() - began
                    if time.monotonic() + pause > deadline:
                        raise StandbyNotConfirmed(
                            f"no standby flushed the commit within {bound:g}s "
                            f"({found[1]} streaming)"
                        )
                    time.sleep(pause)  # polling the server's view: it offers nothing to await
                    pause = min(pause * 2, POLL_MAX)
        finally:
            if self._observe is not None:
                self._observe(subscription, purpose, time.monotonic() - began, confirmed)
