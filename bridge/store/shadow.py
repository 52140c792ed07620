"""The shadow subscriptions' table family, as the report reads it: what a shadow subscription
recorded (``shadow_operation``, ``shadow_delivery``), an existing system's effect log in the
same database, and the record's end.

The inbox's store writes the record (``ingest_shadow``); the report pages through both sides
from cursors held on the server, so a long comparison holds neither a transaction nor a
snapshot open.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Final

import psycopg
import psycopg.sql
from psycopg.abc import Query

from bridge import sql
from bridge.errors import ConfigError
from bridge.store.db import Database
from bridge.store.records import SeenOperation
from bridge.types import Key

#: rows of a shadow report's query per round trip: what the report holds of the record at once
SHADOW_PAGE_DEFAULT: Final = 1000


class ShadowStore:
    """The shadow record and the effect tables a shadow report compares it with."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def decisions(self, subscriptions: Sequence[str]) -> list[tuple[str | None, str, int]]:
        """(job type, decision, deliveries) of what these shadow subscriptions recorded."""
        with self._db.connection("shadow report") as conn:
            rows = conn.execute(
                sql.statement("shadow_decisions"), {"subscription": list(subscriptions)}
            ).fetchall()
        return [(j, d, int(n)) for j, d, n in rows]

    def operations(
        self, subscriptions: Sequence[str], *, page: int = SHADOW_PAGE_DEFAULT
    ) -> Generator[SeenOperation, None, None]:
        """The operations these shadow subscriptions recorded, one per operation with the
        payload hash it was first seen with, in key order (code point order of tenant, then
        operation), ``page`` rows per round trip: :meth:`_held_pages`."""
        rows = self._held_pages(
            "shadow_operations",
            sql.statement("shadow_operations"),
            {"subscription": list(subscriptions)},
            page,
        )
        for t, o, j, h in rows:
            yield SeenOperation(Key(t, o), j, bytes(h))

    def effect_table(
        self, name: str, *, page: int = SHADOW_PAGE_DEFAULT
    ) -> Generator[dict[str, Any], None, None]:
        """Every row of the table or view ``name`` (``schema.table`` or ``table``) as a dict,
        in the key order of :meth:`operations`, ``page`` rows per round trip: an effect
        log the existing system keeps in this database."""
        parts = name.split(".")
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise ConfigError(f"an effect table is named table or schema.table, not {name!r}")
        query = psycopg.sql.SQL(sql.statement("shadow_effects_table")).format(
            effects=psycopg.sql.Identifier(*parts)
        )
        missing = f"shadow report: no table or view {name!r}"
        for (row,) in self._held_pages("shadow_effects", query, {}, page, missing=missing):
            yield dict(row)

    def _held_pages(
        self,
        name: str,
        query: Query,
        params: Mapping[str, Any],
        page: int,
        *,
        missing: str | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of a report's query, ``page`` at a time, from a cursor held on the server
        (``WITH HOLD``): the client keeps one page, and no transaction stays open while it
        works through one, so neither the idle transaction limit nor a snapshot held back
        from vacuum depends on how long the report takes. The server keeps the result until
        the cursor closes (with the generator, or the session). ``missing``: the error when
        the query names a table that does not exist (an operator's table)."""
        if page < 1:
            raise ValueError(f"a page holds at least one row, not {page}")
        with (
            self._db.connection("shadow report") as conn,
            conn.cursor(name=name, withhold=True) as cursor,
        ):
            try:
                cursor.execute(query, params)
            except psycopg.errors.UndefinedTable as exc:
                if missing is None:
                    raise
                raise ConfigError(missing) from exc
            while rows := cursor.fetchmany(page):
                yield from rows

    def clear(self, subscription: str) -> tuple[int, int]:
        """Forget one shadow subscription's record: (operations, deliveries) removed."""
        with self._db.connection("shadow clear") as conn, conn.transaction():
            row = conn.execute(
                sql.statement("shadow_clear"), {"subscription": subscription}
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])
