"""The building blocks of configuration tables: one model base and the value types they share.

A table is a frozen pydantic model that refuses unknown keys. A value whose problem needs our
own words raises :func:`invalid`, whose text :mod:`bridge.config.problems` shows as it is; a
:class:`Shown` in a key's metadata tells the reference how to show its type or default.
Adapters in ``consumers/`` build their subscription keys from the same pieces.
"""

from __future__ import annotations

import keyword
import re
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    StrictStr,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from bridge.ingest.decode import FieldSource, PayloadSource, SourceKind, identifier_problem
from bridge.store.work import Rate

#: the error type of a problem written in our own words (see :func:`invalid`)
PROBLEM: Final = "fencebridge"

#: every table: unknown keys are errors (a typo must not fall back to a default), values are
#: never coerced (`"5"` is not a number), and a ValidationError printed by accident shows no
#: input that could be a secret
TABLE_CONFIG: Final = ConfigDict(
    extra="forbid",
    frozen=True,
    hide_input_in_errors=True,
    allow_inf_nan=False,
    arbitrary_types_allowed=False,
)


class Table(BaseModel):
    """A TOML table. ``name`` is the table's own name (``[jobs.<name>]``), never a key."""

    model_config = TABLE_CONFIG

    _name: str = PrivateAttr(default="")

    @property
    def name(self) -> str:
        """The table's name in the file; empty for a table that is not one of many."""
        return self._name

    @classmethod
    def read(cls, raw: object, *, name: str = "", context: dict[str, Any] | None = None) -> Self:
        """Validate one table; raises :class:`pydantic.ValidationError` with every problem."""
        table = cls.model_validate(raw, context=context)
        table._name = name
        return table


@dataclass(frozen=True, slots=True)
class Shown:
    """How the reference shows a key whose type or default is not plain."""

    kind: str | None = None
    default: str | None = None


@dataclass(frozen=True, slots=True)
class Sources:
    """The kinds of field source a decode key may read (for the reference's table)."""

    allowed: tuple[SourceKind, ...]


def invalid(text: str, *, key: Sequence[str | int] = ()) -> PydanticCustomError:
    """A problem in our own words; ``key`` is where it sits, below the value being checked."""
    return invalid_all([(tuple(key), text)])


def invalid_all(found: Sequence[tuple[tuple[str | int, ...], str]]) -> PydanticCustomError:
    """Several problems found by one check across keys, each reported on its own line."""
    return PydanticCustomError(
        PROBLEM, "{problem}", {"problem": "; ".join(t for _, t in found), "found": tuple(found)}
    )


def shown(raw: object) -> str:
    """A TOML value as an error message shows it."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, str):
        text = repr(raw)
        return text if len(text) <= 80 else f"{text[:76]}...{text[0]}"
    if isinstance(raw, int | float):
        return repr(raw)
    if isinstance(raw, dict):
        return "a table"
    if isinstance(raw, list | tuple):
        return "an array"
    return f"a {type(raw).__name__}"


def either(names: Sequence[str]) -> str:
    """``a, b or c``: the alternatives an error or the reference offers."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def checked(check: Callable[[str], str | None]) -> AfterValidator:
    """A string check that returns its problem (never repeating a secret) or None."""

    def validate(text: str) -> str:
        problem = check(text)
        if problem:
            raise invalid(problem)
        return text

    return AfterValidator(validate)


# -- strings ------------------------------------------------------------------------------------

NAME_RULE: Final = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def name_problem(text: str) -> str | None:
    return None if _NAME.match(text) else f"expected {NAME_RULE}, got {shown(text)}"


def _identifier(text: str) -> str | None:
    if text == "":
        return "must not be empty"
    problem = identifier_problem(text)
    return f"the value {problem}" if problem else None


def _import_path(text: str) -> str | None:
    # one attribute of the module: the bridge imports the module and takes that attribute
    module, colon, attribute = text.partition(":")
    names = [*module.split("."), attribute]
    if colon and all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return None
    return f"expected an import path 'module.path:attribute', got {shown(text)}"


def _host(text: str) -> str | None:
    if text and text.isprintable() and not any(c.isspace() for c in text):
        return None
    return f"expected a host name or address, got {shown(text)}"


def _url(text: str) -> str | None:
    parts = urllib.parse.urlsplit(text) if text.isprintable() and " " not in text else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        return f"expected an http:// or https:// URL, got {shown(text)}"
    return None


Identifier = Annotated[
    StrictStr,
    checked(_identifier),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 256}),
    Shown(kind="string, 1..256 characters, no control characters or surrounding whitespace"),
]
Name = Annotated[
    StrictStr,
    checked(name_problem),
    WithJsonSchema({"type": "string", "pattern": NAME_PATTERN}),
    Shown(kind="job type name"),
]
ImportPath = Annotated[
    StrictStr,
    checked(_import_path),
    WithJsonSchema({"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"}),
    Shown(kind="string, `module.path:attribute`"),
]
HostName = Annotated[
    StrictStr,
    checked(_host),
    WithJsonSchema({"type": "string", "pattern": r"^\S+$"}),
    Shown(kind="string, host name or address"),
]
HttpUrl = Annotated[
    StrictStr,
    checked(_url),
    WithJsonSchema({"type": "string", "pattern": r"^https?://\S+$"}),
    Shown(kind="string, http:// or https:// URL"),
]


def distinct(items: tuple[str, ...]) -> tuple[str, ...]:
    """An array whose elements are each listed once."""
    for i, value in enumerate(items):
        if value in items[:i]:
            raise invalid(f"{value!r} is listed twice", key=(i,))
    return items


# -- decode sources -----------------------------------------------------------------------------

SPELLING: Final = {
    SourceKind.ATTRIBUTE: "attribute:NAME",
    SourceKind.BODY: "body:/json/pointer",
    SourceKind.VALUE: "value:TEXT",
    SourceKind.MESSAGE_ID: "message_id",
}


def alternatives(kinds: Sequence[SourceKind], quote: str) -> str:
    return either([f"{quote}{SPELLING[k]}{quote}" for k in kinds])


def _field_source(allowed: tuple[SourceKind, ...]) -> Callable[[object], FieldSource]:
    plain = tuple(k for k in allowed if k is not SourceKind.MESSAGE_ID)
    expected = f"expected {alternatives(plain, chr(39))}"

    def validate(raw: object) -> FieldSource:
        if isinstance(raw, FieldSource):
            return raw
        if not isinstance(raw, str):
            raise invalid(f"{expected}, got {shown(raw)}")
        prefix, colon, _ = raw.partition(":")
        kind = SourceKind.MESSAGE_ID if raw == SourceKind.MESSAGE_ID else None
        if colon and prefix in (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.VALUE):
            kind = SourceKind(prefix)
        if kind is None:
            raise invalid(f"{expected}, got {shown(raw)}")
        if kind is SourceKind.VALUE and kind not in allowed:
            raise invalid(
                f"a constant operation id would make every delivery one operation; {expected}"
            )
        if kind is SourceKind.MESSAGE_ID and kind not in allowed:
            raise invalid(f"'message_id' is a source for operation_id only; {expected}")
        try:
            return FieldSource.parse(raw)
        except ValueError as exc:
            raise invalid(f"{exc}, in {shown(raw)}") from None

    return validate


def _source_schema(allowed: tuple[SourceKind, ...]) -> dict[str, Any]:
    spelled = ["^message_id$" if k is SourceKind.MESSAGE_ID else f"^{k.value}:" for k in allowed]
    return {"type": "string", "pattern": "|".join(spelled)}


DECODE_SOURCES: Final = (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.VALUE)
OPERATION_SOURCES: Final = (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.MESSAGE_ID)

DecodeSource = Annotated[
    FieldSource,
    PlainValidator(_field_source(DECODE_SOURCES), json_schema_input_type=str),
    PlainSerializer(str, return_type=str),
    WithJsonSchema(_source_schema(DECODE_SOURCES)),
    Shown(kind=f"field source: {alternatives(DECODE_SOURCES, '`')}"),
    Sources(DECODE_SOURCES),
]
OperationSource = Annotated[
    FieldSource,
    PlainValidator(_field_source(OPERATION_SOURCES), json_schema_input_type=str),
    PlainSerializer(str, return_type=str),
    WithJsonSchema(_source_schema(OPERATION_SOURCES)),
    Shown(kind=f"field source: {alternatives(OPERATION_SOURCES, '`')}"),
    Sources(OPERATION_SOURCES),
]


def _payload(raw: object) -> PayloadSource:
    if isinstance(raw, PayloadSource):
        return raw
    if not isinstance(raw, str) or not (raw == "body" or raw.startswith("body:")):
        raise invalid(f"expected 'body' or 'body:/json/pointer', got {shown(raw)}")
    try:
        return PayloadSource.parse(raw)
    except ValueError as exc:
        raise invalid(f"{exc}, in {shown(raw)}") from None


Payload = Annotated[
    PayloadSource,
    PlainValidator(_payload, json_schema_input_type=str),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string", "pattern": "^body(:.*)?$"}),
    Shown(kind="`body` or `body:/json/pointer`"),
]


# -- rates --------------------------------------------------------------------------------------


def _rate(raw: object) -> Rate:
    if isinstance(raw, Rate):
        return raw
    if not isinstance(raw, str):
        raise invalid(
            'expected a string such as "50/s", "600/min" or "1000/h" (runs per second, minute '
            f"or hour), got {shown(raw)}"
        )
    try:
        return Rate.parse(raw)
    except ValueError as exc:
        raise invalid(str(exc)) from None


RateText = Annotated[
    Rate,
    PlainValidator(_rate, json_schema_input_type=str),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^\s*[0-9]+\s*/\s*(s|min|h)\s*$"}),
    Shown(kind='rate: `"<runs>/s"`, `"<runs>/min"` or `"<runs>/h"`'),
]
