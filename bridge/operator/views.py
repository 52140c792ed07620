"""What an operator is shown of a record, in one place: ``fencebridge inspect``, ``status`` and
the console's pages and API read these views, so a field added here appears in all of them.

Text a person typed (audit reasons, actors) or a program reported (error classes, findings)
may hold control characters; :func:`printable` makes any text safe to print on a terminal or
in a log line.
"""

from __future__ import annotations

import unicodedata

#: characters kept as they are even though Unicode calls them control characters
_KEPT = frozenset("\t")


def printable(text: str) -> str:
    """``text`` with every control or format character (CR, LF, ESC, bidi overrides, ...)
    written as its escape, so that printing it cannot move the cursor, add a line, or colour
    the terminal."""
    if all(c in _KEPT or unicodedata.category(c) not in ("Cc", "Cf", "Cs") for c in text):
        return text
    return "".join(
        c
        if c in _KEPT or unicodedata.category(c) not in ("Cc", "Cf", "Cs")
        else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )


def reason_problem(text: str) -> str | None:
    """Why ``text`` cannot be an audit reason, or None when it can: a reason is read later on
    terminals and pages, so it holds no control or format characters."""
    if not text.strip():
        return "must not be blank"
    if printable(text) != text or "\t" in text:
        return "must not hold control characters (line breaks, escapes)"
    return None
