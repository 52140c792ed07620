"""What the commands' parsers share: argument types, the database flag, usage errors.

An argument type raises :class:`argparse.ArgumentTypeError`, so argparse names the flag and
exits 2; a check that needs several arguments raises :func:`usage` from the command, which
:func:`bridge.cli.main` turns into the same exit.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, TypeAlias

from bridge.database import DATABASE_URL_ENV
from bridge.identity import IDENTITY_KEY_ENV

if TYPE_CHECKING:
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: the note of every command that shows tenants and operations
KEY_NOTE = f"Tenants and operations are shown as keyed hashes: ${IDENTITY_KEY_ENV} must be set."

_DURATION = re.compile(r"([1-9][0-9]*)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


class UsageError(Exception):
    """Arguments that parse one by one but not together; exits 2 like any usage error."""


def usage(message: str) -> UsageError:
    return UsageError(message)


def add_database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help=f"libpq URL of the database (default: ${DATABASE_URL_ENV})",
    )


def duration(text: str) -> timedelta:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30d, 12h or 90m, got {text!r}"
        )
    try:
        return timedelta(**{_UNITS[match[2]]: int(match[1])})
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from None


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def audit_text(text: str) -> str:
    """A reason for the audit: stored text without control characters."""
    from bridge.operator.views import reason_problem

    problem = reason_problem(stored_text(text))
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def stored_text(text: str) -> str:
    """A non-empty argument the database can store; never echoed (it may be an identifier)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not valid UTF-8 text") from None
    return text
