"""The store's statements as they are sent: comments and indentation off, short enough to cache.

psycopg converts a query's ``%(name)s`` placeholders on every execution unless the text is at
most ``MAX_CACHED_STATEMENT_LENGTH`` characters; the claim's text once passed that and paid
the conversion at every claim.
"""

from __future__ import annotations

from importlib import resources

import pytest
from psycopg import _queries

from bridge import sql

NAMES = sorted(
    entry.name.removesuffix(".sql")
    for entry in resources.files("bridge.sql").joinpath("store").iterdir()
    if entry.name.endswith(".sql")
)


@pytest.mark.parametrize("name", NAMES)
def test_a_statement_is_sent_without_comments_and_within_psycopgs_cache_limit(name: str) -> None:
    text = sql.statement(name)
    lines = text.splitlines()
    assert lines, name
    assert not [line for line in lines if line.lstrip().startswith("--")]
    assert all(line == line.strip() and line for line in lines)
    assert len(text) <= _queries.MAX_CACHED_STATEMENT_LENGTH, (name, len(text))


def test_compacting_keeps_every_line_of_sql_in_order() -> None:
    source = "-- a comment\nWITH a AS (\n    SELECT 1\n)\n\n  -- another\nSELECT * FROM a\n"
    assert sql._compact(source) == "WITH a AS (\nSELECT 1\n)\nSELECT * FROM a"


def test_a_limit_is_written_into_the_claims_as_a_number() -> None:
    text = sql.with_limit("claim", 16)
    assert "%(limit)s" not in text
    assert "LIMIT 16" in text
    assert text == sql.statement("claim").replace("%(limit)s", "16")
    assert "LIMIT 3" in sql.with_limit("claim_keys", 3)


def test_a_limit_needs_a_statement_that_takes_one_and_a_positive_number() -> None:
    with pytest.raises(ValueError, match="no %\\(limit\\)s"):
        sql.with_limit("settle_many", 10)
    with pytest.raises(ValueError, match="at least 1"):
        sql.with_limit("claim", 0)
