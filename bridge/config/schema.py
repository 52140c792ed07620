"""The configuration file's JSON Schema, from the same models that validate it.

Editors that read JSON Schema for TOML (taplo, Even Better TOML) use it to check
``bridge.toml`` as it is typed. A subscription's table is one alternative per installed
source: the core's keys and that adapter's, chosen by the value of ``source``. The schema
checks what a schema can say (types, ranges, unknown keys, spellings); the rules across keys
and tables (a job type a subscription names must be declared, say) are the reader's alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal, Union, cast

from pydantic import BaseModel, Field, create_model

from bridge import sources
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


def config_schema(source_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The schema of the whole file; ``source_names`` defaults to every installed source."""
    names = sources.names() if source_names is None else source_names
    alternatives = [_subscription(n) for n in names]
    subscription: Any = alternatives[0]
    if len(alternatives) > 1:
        subscription = Annotated[Union[tuple(alternatives)], Field(discriminator="source")]  # noqa: UP007
    table_name: Any = Annotated[str, Field(pattern=NAME_PATTERN)]
    tables: dict[str, Any] = {
        "bridge": (BridgeSettings, Field(default_factory=BridgeSettings)),
        "jobs": (dict[table_name, JobConfig], Field(min_length=1)),
        "subscriptions": (dict[table_name, subscription], Field(min_length=1)),
        "retention": (RetentionConfig | None, Field(default=None)),
        "outbox": (dict[table_name, DestinationConfig], Field(default_factory=dict)),
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
