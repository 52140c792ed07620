"""The configuration file's JSON Schema, from the same models that validate it.

Editors that read JSON Schema for TOML (taplo, Even Better TOML) use it to check
``bridge.toml`` as it is typed. A subscription's table is one alternative per installed
source: the core's keys and that adapter's, chosen by the value of ``source``; a destination's
table likewise, one per installed sink, chosen by ``sink``. The schema
checks what a schema can say (types, ranges, unknown keys, spellings); the rules across keys
and tables (a job type a subscription names must be declared, say) are the reader's alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal, Union, cast

from pydantic import BaseModel, Field, create_model

from bridge.adapters import sinks, sources
from bridge.config.fields import NAME_PATTERN, TABLE_CONFIG
from bridge.config.model import (
    BridgeSettings,
    DestinationConfig,
    JobConfig,
    RetentionConfig,
    SubscriptionConfig,
)

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
TITLE: Final = "fencebridge configuration (bridge.toml)"


def _subscription(name: str) -> type[BaseModel]:
    settings = sources.adapter(name).settings
    keys: dict[str, Any] = {
        "source": (cast(Any, Literal)[name], Field(description=f"The broker adapter: `{name}`."))
    }
    return create_model(
        f"Subscription_{name}",
        __base__=(SubscriptionConfig, settings),
        __doc__=SubscriptionConfig.__doc__,
        **keys,
    )


def _destination(name: str) -> type[BaseModel]:
    settings = sinks.adapter(name).settings
    keys: dict[str, Any] = {
        "sink": (cast(Any, Literal)[name], Field(description=f"The sink: `{name}`."))
    }
    return create_model(
        f"Destination_{name}",
        __base__=(DestinationConfig, settings),
        __doc__=DestinationConfig.__doc__,
        **keys,
    )


def _one_of(alternatives: Sequence[type[BaseModel]], key: str) -> Any:
    """One table's alternatives, chosen by the value of ``key``."""
    if len(alternatives) == 1:
        return alternatives[0]
    return Annotated[Union[tuple(alternatives)], Field(discriminator=key)]  # noqa: UP007


def config_schema(
    source_names: Sequence[str] | None = None, sink_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The schema of the whole file; the names default to every installed source and sink."""
    names = sources.names() if source_names is None else source_names
    subscription: Any = _one_of([_subscription(n) for n in names], "source")
    sink_names = sinks.names() if sink_names is None else sink_names
    destination: Any = _one_of([_destination(n) for n in sink_names], "sink")
    table_name: Any = Annotated[str, Field(pattern=NAME_PATTERN)]
    tables: dict[str, Any] = {
        "bridge": (BridgeSettings, Field(default_factory=BridgeSettings)),
        "jobs": (dict[table_name, JobConfig], Field(min_length=1)),
        "subscriptions": (dict[table_name, subscription], Field(min_length=1)),
        "retention": (RetentionConfig | None, Field(default=None)),
        "outbox": (dict[table_name, destination], Field(default_factory=dict)),
    }
    document = create_model("BridgeFile", __config__=TABLE_CONFIG, **tables)
    schema = document.model_json_schema()
    properties = schema["properties"]
    for section in ("jobs", "subscriptions", "outbox"):
        # a table whose name breaks the naming rule is refused, not left unchecked
        properties[section]["additionalProperties"] = False
    # TOML has no null: the table is either there, or left out
    properties["retention"] = {"$ref": "#/$defs/RetentionConfig"}
    return {"$schema": DIALECT, "title": TITLE, **{k: v for k, v in schema.items() if k != "title"}}
