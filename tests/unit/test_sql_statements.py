"""The store's statements as they are sent: comments and indentation off, converted once.

psycopg converts a query's ``%(name)s`` placeholders on every execution unless the text is at
most ``MAX_CACHED_STATEMENT_LENGTH`` characters; the claim's text once passed that and paid
the conversion at every claim. A statement past it (the claims of limited job types) is sent
in the positional form, converted once by the store, which must be what psycopg would send.
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
def test_a_statement_is_sent_without_comments_and_converted_once(name: str) -> None:
    text = sql.statement(name)
    lines = text.splitlines()
    assert lines, name
    assert not [line for line in lines if line.lstrip().startswith("--")]
    assert all(line == line.strip() and line for line in lines)
    if len(text) > _queries.MAX_CACHED_STATEMENT_LENGTH:
        assert name in PAST_THE_CACHE, (name, len(text))
        assert_positional_is_psycopgs(text)


#: the statements longer than psycopg caches, sent in the positional form; any other statement
#: must stay within the cache
PAST_THE_CACHE = {"claim_limited", "claim_keys_limited"}


def assert_positional_is_psycopgs(text: str) -> None:
    converted, _formats, order, _parts = _queries._query2pg_nocache(text.encode(), "utf-8")
    positional = sql.positional(text)
    assert positional.text.encode() == converted
    assert order is not None
    assert list(positional.names) == order[: len(positional.names)]
    assert set(order) == set(positional.names)


def test_the_cache_limit_is_psycopgs() -> None:
    assert sql.CACHED_LENGTH == _queries.MAX_CACHED_STATEMENT_LENGTH


def test_the_positional_form_numbers_each_name_once_in_order_of_first_use() -> None:
    statement = sql.positional("SELECT %(b)s, %(a)s, %(b)s::int WHERE x = %(c)s")
    assert statement.text == "SELECT $1, $2, $1::int WHERE x = $3"
    assert statement.names == ("b", "a", "c")
    assert statement.values({"a": 1, "b": 2, "c": 3, "unused": 4}) == [2, 1, 3]
    with pytest.raises(KeyError):
        statement.values({"a": 1})
    with pytest.raises(ValueError, match="literal %"):
        sql.positional("SELECT 'x%%' WHERE a = %(a)s")
    with pytest.raises(ValueError, match="named placeholders only"):
        sql.positional("SELECT %s")


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
