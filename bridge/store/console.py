"""The console's on-call reads: what awaits a person, failure groups and their rows, and the key
behind a listed row's handle. Part of the console's table family (``store.console``,
:class:`~bridge.store.listing.ConsoleQueries` takes them in), kept in a module of their own so
that neither stays long; each statement is a named file under ``bridge/sql/store/console_*.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bridge import sql
from bridge.store.db import Database
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


class OnCallReads:
    """The on-call pages' reads, on the console family's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def awaiting(self) -> list[Awaiting]:
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_waiting_people")).fetchall()
        return [Awaiting(w, k, int(n), oldest) for w, k, n, oldest in rows]

    def failure_groups(self, limit: int = 200) -> list[FailureGroup]:
        with self._db.connection("console") as conn:
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
        with self._db.connection("console") as conn:
            rows = conn.execute(sql.statement("console_group_rows"), params).fetchall()
        return [GroupRow(Key(t, o), int(f)) for t, o, f in rows]

    def key_of_row(self, seq: int) -> Key | None:
        with self._db.connection("console") as conn:
            row = conn.execute(sql.statement("console_key_of_row"), {"seq": seq}).fetchone()
        return Key(row[0], row[1]) if row is not None else None

    def key_of_rejected(self, rejected_id: int) -> Key | None:
        with self._db.connection("console") as conn:
            row = conn.execute(
                sql.statement("console_key_of_rejected"), {"id": rejected_id}
            ).fetchone()
        return Key(row[0], row[1]) if row is not None else None
