"""The store's own array encoders, read back by a real server as psycopg's own lists are."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bridge.store.arrays import BigintArray, TextArray

Db = psycopg.Connection[Any]

TEXTS = [
    [],
    ["a"],
    ["op-0001", None, "", "ü ∑ 🚀", 'comma, quote" brace{} backslash\\', None],
    [None],
    [f"operation-{i:06d}" for i in range(1_000)],
]
BIGINTS = [[], [1], [0, -1, 2**63 - 1, -(2**63)], list(range(1_000))]


@pytest.mark.parametrize("values", TEXTS, ids=lambda v: f"{len(v)} texts")
@pytest.mark.parametrize("placeholder", ["%s", "%b"])
def test_a_text_array_reads_back_as_the_list_it_was(
    db: Db, values: list[str | None], placeholder: str
) -> None:
    mine = db.execute(f"SELECT {placeholder}::text[]", [TextArray(values)]).fetchone()
    theirs = db.execute("SELECT %s::text[]", [values]).fetchone() if values else ([],)
    assert mine == theirs == (values,)


@pytest.mark.parametrize("values", BIGINTS, ids=lambda v: f"{len(v)} bigints")
def test_a_bigint_array_reads_back_as_the_list_it_was(db: Db, values: list[int]) -> None:
    row = db.execute(
        "SELECT %s::bigint[], pg_typeof(%s)::text", [BigintArray(values), BigintArray(values)]
    ).fetchone()
    assert row == (values, "bigint[]")


def test_arrays_unnest_side_by_side_as_the_statements_use_them(db: Db) -> None:
    tenants = TextArray(["t1", "t2", None])
    fences = BigintArray([1, 2, 3])
    rows = db.execute(
        "SELECT * FROM unnest(%(t)b::text[], %(f)b::bigint[]) AS k(t, f)",
        {"t": tenants, "f": fences},
    ).fetchall()
    assert rows == [("t1", 1), ("t2", 2), (None, 3)]


def test_a_bigint_array_with_a_null_or_a_text_is_refused_before_it_is_sent(db: Db) -> None:
    for bad in ([1, None], [1, "2"]):
        with pytest.raises(TypeError, match="non-integer"):
            db.execute("SELECT %s::bigint[]", [BigintArray(bad)])  # type: ignore[list-item]
