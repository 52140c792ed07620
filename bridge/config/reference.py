"""The configuration reference (``docs/configuration.md``), written from the models themselves.

Each key's entry is its type and range, its default and its description, read from the field
that validates it; a source's keys come from its adapter. The reference documents the sources
this distribution ships, so that it reads the same wherever it is generated.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bridge.adapters import sinks, sources
from bridge.config.fields import SPELLING, Shown, Sources, either
from bridge.config.model import (
    BridgeSettings,
    DecodeConfig,
    DestinationConfig,
    JobConfig,
    RetentionConfig,
    SubscriptionConfig,
)
from bridge.database import DATABASE_URL_ENV
from bridge.ingest.decode import REASONS, RULES_MARKDOWN, FieldSource, PayloadSource, SourceKind

INTRO: Final = f"""\
fencebridge reads one TOML file: process settings in `[bridge]`, one `[jobs.<name>]` table per
job type and one `[subscriptions.<name>]` table per broker subscription, each with its
`[subscriptions.<name>.decode]` rules, the retention plan in `[retention]`, and the class A
outbox's destinations in `[outbox.<name>]`.
`docs/examples/bridge.toml` is a complete example, and `fencebridge config schema` prints the
file's JSON Schema, for editors that check TOML as it is typed (taplo, Even Better TOML).

The file is checked whole before anything starts, and every problem in it is reported at
once, one per line. Every error names the file, the dotted key and what is wrong; unknown keys
are errors, so a typo cannot fall back to a default. Secrets
never come from the file: the database URL is read from `{DATABASE_URL_ENV}`, and a
`database_url` key anywhere in the file is an error. AWS and Google credentials, endpoints and
emulators come from the variables their client libraries read (`AWS_*`,
`PUBSUB_EMULATOR_HOST`, `GOOGLE_APPLICATION_CREDENTIALS`)."""

_SOURCE_MEANING: Final[Mapping[SourceKind, str]] = {
    SourceKind.ATTRIBUTE: "the broker message attribute `NAME` (SQS message attribute, Pub/Sub "
    "attribute), matched exactly",
    SourceKind.BODY: "the value at an RFC 6901 JSON pointer into the JSON body (`~1` is `/`, "
    "`~0` is `~`); `body:` with an empty pointer is the whole document",
    SourceKind.VALUE: "the constant `TEXT`, for a subscription that carries one tenant, job "
    "type or schema version",
    SourceKind.MESSAGE_ID: "the broker's message id (weaker: see `operation_id_from_message_id`)",
}


def _markers(annotation: Any) -> Iterator[object]:
    """Metadata of ``Annotated`` types inside an annotation (``X | None`` included)."""
    if typing.get_origin(annotation) is typing.Annotated:
        yield from annotation.__metadata__
        yield from _markers(typing.get_args(annotation)[0])
    elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _markers(arg)


def _marker(info: FieldInfo, cls: type[Any]) -> Any:
    for found in (*info.metadata, *_markers(info.rebuild_annotation())):
        if isinstance(found, cls):
            return found
    return None


def _shown(info: FieldInfo, attribute: str) -> str | None:
    """What the nearest :class:`Shown` says of the key's ``kind`` or ``default``."""
    for found in (*info.metadata, *_markers(info.rebuild_annotation())):
        text = getattr(found, attribute, None) if isinstance(found, Shown) else None
        if text is not None:
            return str(text)
    return None


def _plain(annotation: Any) -> Any:
    """The annotation without ``None`` and ``Annotated``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        else:
            return annotation


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _bound(info: FieldInfo, name: str) -> float | None:
    for constraint in info.metadata:
        value = getattr(constraint, name, None)
        if isinstance(value, int | float):
            return value
    return None


def _range(annotation: Any, info: FieldInfo) -> str | None:
    low, above, high = _bound(info, "ge"), _bound(info, "gt"), _bound(info, "le")
    if high is None:
        return None
    if annotation is int and low is not None:
        return f"integer, {_number(low)}..{_number(high)}"
    if annotation is float and above is not None:
        return f"number, > {_number(above)} and ≤ {_number(high)}"
    if annotation is float and low is not None:
        return f"number, {_number(low)}..{_number(high)}"
    return None


def _kind(info: FieldInfo) -> str:
    annotation = _plain(info.annotation)
    kind = _shown(info, "kind") or _range(annotation, info)
    if kind is not None:
        return kind
    if annotation is bool:
        return "boolean"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return either([f"`{choice.value}`" for choice in annotation])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return "string"


def _literal(value: object) -> str:
    """A default as TOML spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | FieldSource | PayloadSource):
        return json.dumps(str(value))
    if isinstance(value, tuple):
        return f"[{', '.join(_literal(v) for v in value)}]"
    return repr(value)


def _default(info: FieldInfo) -> str:
    shown = _shown(info, "default")
    if shown is not None:
        return f"default {shown}"
    if info.is_required():
        return "required"
    default = info.get_default(call_default_factory=True)
    if default is None:
        return "optional"
    return f"default `{_literal(default)}`"


def key_markdown(name: str, info: FieldInfo) -> str:
    """One key's entry: type and range, default, then what it does."""
    return f"### `{name}`\n\n{_kind(info)}; {_default(info)}.\n\n{info.description or ''}"


def _section(title: str, model: type[BaseModel], doc: str | None = None) -> list[str]:
    parts = [f"## {title}", inspect.cleandoc(doc or model.__doc__ or "")]
    parts.extend(key_markdown(name, info) for name, info in model.model_fields.items())
    return parts


def _nested(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    found = []
    for name, info in model.model_fields.items():
        annotation = _plain(info.annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.append((name, annotation))
    return found


def _source_sections(name: str) -> list[str]:
    settings = sources.adapter(name).settings
    parts = _section(f'`source = "{name}"`', settings)
    for key, table in _nested(settings):
        parts.extend(_section(f"`subscriptions.<name>.{key}` (`{name}`)", table))
    return parts


def _sources_markdown() -> str:
    allowed: dict[SourceKind, list[str]] = {kind: [] for kind in SourceKind}
    for name, info in DecodeConfig.model_fields.items():
        reads: Sources | None = _marker(info, Sources)
        for kind in reads.allowed if reads else ():
            allowed[kind].append(f"`{name}`")
    rows = [
        f"| `{SPELLING[kind]}` | {_SOURCE_MEANING[kind]} | {', '.join(allowed[kind])} |"
        for kind in SourceKind
    ]
    return "\n".join(
        ["## Field sources", "", "| source | reads | allowed for |", "| --- | --- | --- |", *rows]
    )


def _reasons_markdown() -> str:
    rows = [f"| `{reason}` | {text} |" for reason, text in REASONS.items()]
    return "\n".join(
        [
            "## Quarantine reasons",
            "",
            "A rejection's reason is `<code>: <explanation>`; the codes are stable.",
            "",
            "| code | meaning |",
            "| --- | --- |",
            *rows,
        ]
    )


def reference_markdown(
    source_names: Sequence[str] | None = None, sink_names: Sequence[str] | None = None
) -> str:
    """The configuration reference; the names default to the shipped sources and sinks."""
    parts = [
        "# Configuration reference",
        "<!-- Generated by `python -m bridge.config` from the configuration models "
        "(bridge/config/, consumers/); edit them there. -->",
        INTRO,
    ]
    parts += _section("`[bridge]`", BridgeSettings)
    parts += _section("`[jobs.<name>]`", JobConfig)
    parts += _section("`[subscriptions.<name>]`", SubscriptionConfig)
    for name in sources.shipped() if source_names is None else source_names:
        parts += _source_sections(name)
    parts += _section("`[subscriptions.<name>.decode]`", DecodeConfig)
    parts += _section("`[retention]`", RetentionConfig)
    parts += _section("`[outbox.<name>]`", DestinationConfig)
    for name in sinks.shipped() if sink_names is None else sink_names:
        parts += _section(f'`sink = "{name}"`', sinks.adapter(name).settings)
    parts.append(_sources_markdown())
    parts.append("## Decoding rules")
    parts.append(RULES_MARKDOWN.strip())
    parts.append(_reasons_markdown())
    return "\n\n".join(parts) + "\n"
