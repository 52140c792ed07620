"""Validation errors as the configuration reports them: the file, the dotted key, the problem.

pydantic finds every problem of a table in one pass; this module words each one the way the
file's reader needs it (``expected an integer, got 2.5``, ``must be from 1 to 256, got 0``),
suggests the nearest key for an unknown one, and drops the "missing" that a typo of the same
key already explains. Values are shown only for keys that hold no secret: the one key that
could (``database_url``) is refused before any table is validated.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from bridge.config.fields import PROBLEM, shown

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Where:
    """Where in the file a value sits, so that every message can name it."""

    file: str
    key: str = ""

    def child(self, part: str | int) -> Where:
        if isinstance(part, int):
            return Where(self.file, f"{self.key}[{part}]")
        name = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
        return Where(self.file, f"{self.key}.{name}" if self.key else name)

    def at(self, loc: Loc) -> Where:
        where = self
        for part in loc:
            where = where.child(part)
        return where

    def message(self, problem: str) -> str:
        return f"{self.file}: {self.key}: {problem}" if self.key else f"{self.file}: {problem}"


def did_you_mean(name: str, known: Sequence[str], otherwise: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {close[0]!r}?" if close else otherwise


def _no_other(_key: str) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Scope:
    """A table validated by more than one model: the core's keys and its plugin's (a
    subscription's source, a destination's sink)."""

    #: every key the table may hold
    known: tuple[str, ...]
    #: the value of the key that names the plugin (the subscription's source)
    plugin: str
    #: the keys its plugin owns
    owned: frozenset[str] = frozenset()
    #: the other plugin a key belongs to, if any
    elsewhere: Callable[[str], str | None] = field(default=_no_other)
    #: the key that names the plugin, and what the table is called in messages
    key: str = "source"
    table: str = "subscription"


def messages(
    found: Sequence[tuple[type[BaseModel], ValidationError]],
    where: Where,
    scope: Scope | None = None,
) -> list[str]:
    """One message per problem of one table: unknown keys first, then in the order pydantic
    found them."""
    errors = [(model, e) for model, exc in found for e in exc.errors(include_url=False)]
    errors.sort(key=lambda pair: pair[1]["type"] != "extra_forbidden")
    meant: set[Loc] = set()  # keys a typo was taken for: their absence is not a second problem
    for model, e in errors:
        if e["type"] == "extra_forbidden" and isinstance(e["loc"][-1], str):
            table, name = e["loc"][:-1], e["loc"][-1]
            if not table and scope is not None and scope.elsewhere(name) is not None:
                continue  # not a typo: a key of another plugin
            close = difflib.get_close_matches(name, _known(model, table, scope), n=1)
            meant.update((*table, m) for m in close)
    lines: list[str] = []
    for model, e in errors:
        if e["type"] == "missing" and e["loc"] in meant:
            continue
        lines.extend(_describe(model, e, where, scope))
    return lines


def _model_at(model: type[BaseModel], table: Loc) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in table:
        info = current.model_fields.get(part) if current and isinstance(part, str) else None
        annotation = info.annotation if info else None
        is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        current = annotation if is_model else None  # type: ignore[assignment]
    return current


def _known(model: type[BaseModel], table: Loc, scope: Scope | None) -> list[str]:
    if not table and scope is not None:
        return list(scope.known)
    found = _model_at(model, table)
    return list(found.model_fields) if found else []


def _describe(
    model: type[BaseModel], e: ErrorDetails, where: Where, scope: Scope | None
) -> list[str]:
    loc, kind, raw = e["loc"], e["type"], e.get("input")
    ctx: dict[str, Any] = dict(e.get("ctx") or {})
    if kind == PROBLEM:
        return [where.at((*loc, *key)).message(text) for key, text in ctx["found"]]
    at = where.at(loc)
    name = loc[-1] if loc else ""
    top = scope is not None and len(loc) == 1
    if kind == "extra_forbidden":
        other = scope.elsewhere(str(name)) if top and scope is not None else None
        if other is not None and scope is not None:
            return [
                at.message(
                    f"applies to {scope.key} = '{other}' only, and this {scope.table}'s "
                    f"{scope.key} is '{scope.plugin}'"
                )
            ]
        known = _known(model, loc[:-1], scope)
        hint = did_you_mean(str(name), known, f"expected one of: {', '.join(known)}")
        return [at.message(f"unknown key; {hint}")]
    if kind == "missing":
        if top and scope is not None and name in scope.owned:
            return [at.message(f"required for {scope.key} = '{scope.plugin}'")]
        return [at.message("required key is missing")]
    return [at.message(_problem(model, e, kind, raw, ctx))]


_EXPECTED: Final = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "tuple_type": "an array of strings",
    "list_type": "an array of strings",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "dict_type": "a table",
}
_RANGE: Final = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
)


def _problem(
    model: type[BaseModel], e: ErrorDetails, kind: str, raw: object, ctx: dict[str, Any]
) -> str:
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {shown(raw)}"
    if kind == "enum":
        return f"expected {ctx['expected']}, got {shown(raw)}"
    if kind == "too_short":
        return "must list at least one"
    if kind in _RANGE:
        bounds = _bounds(model, e["loc"])
        if bounds:
            return f"must be {bounds}, got {shown(raw)}"
    return str(e["msg"])


def _bounds(model: type[BaseModel], loc: Loc) -> str | None:
    """``from 1 to 256`` or ``more than 0 to 3600``: a key's range as its own field states it."""
    table = _model_at(model, loc[:-1])
    info = table.model_fields.get(str(loc[-1])) if table and loc else None
    if info is None:
        return None
    found: dict[str, float] = {}
    for constraint in info.metadata:
        for bound in ("ge", "gt", "le"):
            value = getattr(constraint, bound, None)
            if isinstance(value, int | float) and not math.isnan(value):
                found[bound] = value
    if "le" not in found or not ("ge" in found or "gt" in found):
        return None
    low = f"more than {_number(found['gt'])}" if "gt" in found else f"from {_number(found['ge'])}"
    return f"{low} to {_number(found['le'])}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)
