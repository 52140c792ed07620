"""Every SQL statement fencebridge runs, loaded by name from the ``.sql`` files beside this module.

Business code never builds SQL: it asks for a statement by its file name and passes parameters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final, LiteralString

#: the first line of a migration that must run outside a transaction (``CREATE INDEX
#: CONCURRENTLY``): its statements run one by one, and each must be safe to run again
NO_TRANSACTION = "-- fencebridge: no transaction"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: LiteralString

    @property
    def transactional(self) -> bool:
        """False for a migration that runs statement by statement, outside a transaction."""
        return not self.sql.startswith(NO_TRANSACTION)

    def statements(self) -> list[LiteralString]:
        """The statements of the file, comments removed, in order (split at ``;``)."""
        lines = [line for line in self.sql.splitlines() if not line.lstrip().startswith("--")]
        text: LiteralString = "\n".join(lines)
        return [part.strip() for part in text.split(";") if part.strip()]


#: a line ``\i <part>`` of a statement stands for the text of ``store/parts/<part>.sql``
INCLUDE: Final = re.compile(r"^\\i ([a-z_]+)$")


@cache
def statement(name: str) -> LiteralString:
    """The text of ``store/<name>.sql``, without its comment lines and indentation.

    What is sent is kept short: psycopg caches the conversion of a query's placeholders only
    for texts of up to 4 KiB (``MAX_CACHED_STATEMENT_LENGTH``) and otherwise converts the
    whole text again at every execution. A line ``\\i <part>`` takes in a part that several
    statements share (the claims' takeovers, filters and end), written once.
    """
    return _compact(_read("store", f"{name}.sql"))


def _read(*path: str) -> LiteralString:
    text: LiteralString = resources.files(__package__).joinpath(*path).read_text("utf-8")
    lines: list[LiteralString] = []
    for line in text.splitlines():
        included = INCLUDE.match(line.strip())
        lines.append(_read("store", "parts", f"{included.group(1)}.sql") if included else line)
    joined: LiteralString = "\n".join(lines)
    return joined


#: the placeholder of a statement's row limit that :func:`with_limit` writes in as a number
LIMIT_PLACEHOLDER: Final = "%(limit)s"


@cache
def with_limit(name: str, limit: int) -> LiteralString:
    """``store/<name>.sql`` with its ``%(limit)s`` written in as the number ``limit``.

    For the claims, which run many times a second: PostgreSQL plans a prepared statement once
    (a generic plan) only when that plan costs no more than planning each execution for its
    parameters. With the row limit a parameter, the generic plan must assume a tenth of the
    queue will be read, looks dear, and the claim was planned again at every execution (about
    1.8 ms of server time, more than the claim itself); with the limit in the text, the generic
    plan is the custom one. One text per limit: a pool claims at most its thread count at once.
    """
    if limit < 1:
        raise ValueError(f"a row limit is at least 1, not {limit}")
    text = statement(name)
    if LIMIT_PLACEHOLDER not in text:
        raise ValueError(f"store/{name}.sql has no {LIMIT_PLACEHOLDER} to write the limit in")
    return text.replace(LIMIT_PLACEHOLDER, str(int(limit)))


#: the longest query text whose placeholders psycopg converts once and caches
#: (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one is converted again, a scan of
#: the whole text, at every execution (about 150 us of client CPU for 5 KiB)
CACHED_LENGTH: Final = 4096

#: a named placeholder, ``%(name)s``
PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True, slots=True)
class Positional:
    """A statement with its named placeholders written as ``$1``, ``$2``, ... in order of first
    use, for psycopg's raw cursor, which sends the text as it is: the conversion psycopg would
    repeat at every execution of a text past :data:`CACHED_LENGTH` is done here once."""

    text: str
    names: tuple[str, ...]

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """The parameters in placeholder order (a missing name raises KeyError, as psycopg's
        own conversion does)."""
        return [params[name] for name in self.names]


@cache
def positional(text: str) -> Positional:
    """``text`` (a statement of this package) with ``$n`` placeholders; cached per text."""
    if "%%" in text:
        raise ValueError("a literal % in a statement is not supported by the positional form")
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    converted = PLACEHOLDER.sub(number, text)
    if "%" in converted.replace("%%", ""):
        raise ValueError("a statement of the positional form takes named placeholders only")
    return Positional(converted, tuple(names))


def _compact(text: LiteralString) -> LiteralString:
    """The lines of a statement that are not comments, stripped, one per line."""
    lines = [line.strip() for line in text.splitlines()]
    kept: LiteralString = "\n".join(line for line in lines if line and not line.startswith("--"))
    return kept


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with the package, in version order (``NNNN_name.sql``)."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        found.append(
            Migration(
                version=int(number),
                name=rest.removesuffix(".sql"),
                sql=entry.read_text("utf-8"),
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must run 1..n without gaps, found {versions}")
    return tuple(found)
