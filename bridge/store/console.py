"""The console's own reads: what awaits a person, failure groups and their rows, and the key
behind a listed row's handle. Kept apart from the protocol's store (:mod:`.postgres`); each
statement is a named file under ``bridge/sql/store/console_*.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from bridge import sql
from bridge.database import Connection, translate_errors
from bridge.store.evidence import DeliveryEvidence, evidence_of
from bridge.types import Key, State


@dataclass(frozen=True, slots=True)
class Awaiting:
    """Work rows in one parked or failed state, or open rejected deliveries of one kind."""

    #: ``row`` or ``delivery``
    what: str
    #: the row state or the delivery kind
    kind: str
    count: int
    oldest: datetime | None


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Parked or failed rows sharing their job type, state, outcome code and error class."""

    job_type: str
    state: State
    outcome_code: str | None
    error_class: str | None
    count: int
    first_seen: datetime | None
    last_seen: datetime | None


@dataclass(frozen=True, slots=True)
class GroupRow:
    key: Key
    fence: int


class ConsoleReads:
    """The console's reads over the bridge's connection pool."""

    def __init__(self, pool: ConnectionPool[Connection]) -> None:
        self._pool = pool

    def awaiting(self) -> list[Awaiting]:
        with translate_errors("console"), self._pool.connection() as conn:
            rows = conn.execute(sql.statement("console_waiting_people")).fetchall()
        return [Awaiting(w, k, int(n), oldest) for w, k, n, oldest in rows]

    def failure_groups(self, limit: int = 200) -> list[FailureGroup]:
        with translate_errors("console"), self._pool.connection() as conn:
            rows = conn.execute(sql.statement("console_failure_groups"), {"limit": limit})
            found = rows.fetchall()
        return [
            FailureGroup(job, State(state), code, error, int(n), first, last)
            for job, state, code, error, n, first, last in found
        ]

    def group_rows(
        self,
        *,
        job_type: str,
        state: State,
        outcome_code: str | None,
        error_class: str | None,
        limit: int,
    ) -> list[GroupRow]:
        params = {
            "job_type": job_type,
            "state": state.value,
            "outcome_code": outcome_code,
            "error_class": error_class,
            "limit": limit,
        }
        with translate_errors("console"), self._pool.connection() as conn:
            rows = conn.execute(sql.statement("console_group_rows"), params).fetchall()
        return [GroupRow(Key(t, o), int(f)) for t, o, f in rows]

    def key_of_row(self, seq: int) -> Key | None:
        with translate_errors("console"), self._pool.connection() as conn:
            row = conn.execute(sql.statement("console_key_of_row"), {"seq": seq}).fetchone()
        return Key(row[0], row[1]) if row is not None else None

    def key_of_rejected(self, rejected_id: int) -> Key | None:
        with translate_errors("console"), self._pool.connection() as conn:
            row = conn.execute(
                sql.statement("console_key_of_rejected"), {"id": rejected_id}
            ).fetchone()
        return Key(row[0], row[1]) if row is not None else None

    def evidence(self, key: Key) -> DeliveryEvidence:
        return evidence_of(self._pool, key)
