"""Parked outbox messages sent back to the relay by an operator, each move audited.

A message the relay parked (refused as invalid, or more than ``max_attempts`` times) is never
sent again by the relay alone. Once its cause is fixed (the queue's size raised, the topic's
schema changed, the destination's credentials restored), ``fencebridge resend`` sets it back
to ``pending`` with the same id, so a consumer that has it already drops the copy, and with no
failed send counted. Like ``fencebridge redrive`` for work rows, every move is one guarded
statement that also writes who moved it, why, and what it had (``outbox_audit``); a dry run
runs the same statement in a transaction that is rolled back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from bridge import sql
from bridge.database import Connection, translate_errors


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


class OutboxResend:
    """The resend's statements on a pool."""

    def __init__(self, pool: ConnectionPool[Connection]) -> None:
        self._pool = pool

    @contextmanager
    def _connection(self, action: str) -> Iterator[Connection]:
        with translate_errors(action), self._pool.connection() as conn:
            yield conn

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

    def of_operation(self, tenant_id: str, operation_id: str) -> list[ResendAudit]:
        """Every resend of the operation's messages, oldest first."""
        params = {"tenant_id": tenant_id, "operation_id": operation_id}
        with self._connection("outbox read") as conn:
            rows = conn.execute(sql.statement("outbox_audit_operation"), params).fetchall()
        return [ResendAudit(*row) for row in rows]
