"""The outbox's table family: the relay's lease (``outbox_relay``), its reads and fenced marks,
and what operators read and move (depth, an operation's messages, purge, resend).

The relay (:mod:`bridge.outbox.relay`) and the operator verbs call these; the statements are
``bridge/sql/store/outbox_*.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from bridge import sql
from bridge.errors import RelayLost
from bridge.outbox.publish import OutboxMessage, message_from_row
from bridge.store.db import Database

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
    """The outbox's statements: the relay's lease, reads and marks, the operators' depth,
    purge and resend."""

    def __init__(self, db: Database) -> None:
        self._connection = db.connection

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

    def parked(self, selection: ParkedSelection) -> int:
        """How many parked messages the selection holds right now."""
        with self._connection("outbox resend") as conn:
            row = conn.execute(sql.statement("outbox_resend_count"), selection.params()).fetchone()
        return int(row[0]) if row is not None else 0

    def resend(
        self,
        selection: ParkedSelection,
        *,
        actor: str,
        reason: str,
        limit: int,
        dry_run: bool = False,
    ) -> list[Resent]:
        """Send back up to ``limit`` of the selection's parked messages, oldest parked first,
        audited; with ``dry_run`` the same statement, rolled back."""
        params = {**selection.params(), "actor": actor, "reason": reason, "limit": limit}
        with (
            self._connection("outbox resend") as conn,
            conn.transaction(force_rollback=dry_run),
        ):
            rows = conn.execute(sql.statement("outbox_resend"), params).fetchall()
        return [Resent(str(m), str(d), int(a), r) for m, d, a, r in rows]

    def resends_of_operation(self, tenant_id: str, operation_id: str) -> list[ResendAudit]:
        """Every resend of the operation's messages, oldest first."""
        params = {"tenant_id": tenant_id, "operation_id": operation_id}
        with self._connection("outbox read") as conn:
            rows = conn.execute(sql.statement("outbox_audit_operation"), params).fetchall()
        return [ResendAudit(*row) for row in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedSelection:
    """Which parked messages: every one unless narrowed (the filters combine)."""

    destination: str | None = None
    tenant_id: str | None = None
    operation_id: str | None = None
    message_ids: Sequence[str] | None = None

    def params(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "tenant_id": self.tenant_id,
            "operation_id": self.operation_id,
            "message_ids": list(self.message_ids) if self.message_ids is not None else None,
        }


@dataclass(frozen=True, slots=True)
class Resent:
    """A message sent back (or, in a dry run, that would be), with what it had when parked."""

    message_id: str
    destination: str
    #: its failed sends when it was moved
    attempts: int
    park_reason: str | None


@dataclass(frozen=True, slots=True)
class ResendAudit:
    """One audited move of one message."""

    at: datetime
    actor: str
    reason: str
    message_id: str
    destination: str
    from_state: str
    to_state: str
    attempts: int
    park_reason: str | None
