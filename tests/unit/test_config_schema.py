"""The configuration's JSON Schema: printed by the CLI, true to the example, as strict as the
reader where a schema can be, and open to every installed source."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bridge.adapters import sinks, sources
from bridge.config import SubscriptionConfig, config_schema, load_config, parse_config
from bridge.errors import ConfigError
from tests.support import memory_source

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "bridge.toml"
PUBLISHED = ROOT / "docs" / "examples" / "bridge.schema.json"

Document = dict[str, Any]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def example() -> Document:
    with EXAMPLE.open("rb") as handle:
        return tomllib.load(handle)


def test_the_published_schema_is_the_generated_one() -> None:
    published = json.loads(PUBLISHED.read_text())
    assert published == config_schema(sources.shipped(), sinks.shipped()), (
        "docs/examples/bridge.schema.json is stale: regenerate it with "
        "`fencebridge config schema > docs/examples/bridge.schema.json`"
    )
    assert EXAMPLE.read_text().startswith(f"#:schema ./{PUBLISHED.name}\n")


def test_the_example_is_valid(validator: jsonschema.Draft202012Validator) -> None:
    load_config(EXAMPLE)  # the reader agrees
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(example())]
    assert errors == []


def _set(path: str, value: object) -> Callable[[Document], None]:
    *tables, key = path.split(".")

    def change(document: Document) -> None:
        table = document
        for name in tables:
            table = table[name]
        table[key] = value

    return change


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_set("jobs.refund.max_attempt", 3), id="typo"),
        pytest.param(_set("bridge.worker_threads", 0), id="range"),
        pytest.param(_set("bridge.poll_interval_seconds", "1s"), id="type"),
        pytest.param(_set("subscriptions.refunds.receive_batch", 11), id="adapter-range"),
        pytest.param(_set("subscriptions.sms.receive_batch", 5), id="key-of-another-source"),
        pytest.param(_set("subscriptions.refunds.source", "kafka"), id="unknown-source"),
        pytest.param(_set("subscriptions.refunds.decode.tenant_id", "tenant"), id="field-source"),
        pytest.param(_set("database_url", "postgresql://x"), id="secret"),
        pytest.param(_set("jobs.re fund", {"handler": "a:b", "target_class": "A"}), id="name"),
        pytest.param(_set("subscriptions.sms.flow_control", {"max_bytes": 10}), id="nested"),
    ],
)
def test_what_the_reader_refuses_the_schema_refuses(
    validator: jsonschema.Draft202012Validator, change: Callable[[Document], None]
) -> None:
    document = copy.deepcopy(example())
    change(document)
    assert not validator.is_valid(document)
    with pytest.raises(ConfigError):
        parse_config(_toml(document))


def _toml(document: Document) -> str:
    """A document back as TOML: enough of it for the tables the example uses."""

    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines: list[str] = []

    def table(name: str, body: Document) -> None:
        lines.append(f"[{name}]")
        nested = {k: v for k, v in body.items() if isinstance(v, dict) and k == "decode"}
        lines.extend(f"{k} = {value(v)}" for k, v in body.items() if k not in nested)
        for k, v in nested.items():
            table(f"{name}.{k}", v)

    for key, v in document.items():
        if key in ("jobs", "subscriptions"):
            for name, body in v.items():
                bare = re.fullmatch(r"[A-Za-z0-9_-]+", name)
                table(f"{key}.{name if bare else json.dumps(name)}", body)
        elif isinstance(v, dict):
            table(key, v)
        else:
            lines.insert(0, f"{key} = {value(v)}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_the_cli_prints_it_with_every_installed_source(tmp_path: Path) -> None:
    memory_source.register(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "config", "schema"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    (subscription,) = schema["properties"]["subscriptions"]["patternProperties"].values()
    sources = {
        schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"]["source"]["const"]
        for ref in subscription["oneOf"]
    }
    assert sources == {"memory", "pubsub", "sqs"}
    document = example()
    refunds = document["subscriptions"]["refunds"]
    core = {k: v for k, v in refunds.items() if k in SubscriptionConfig.model_fields}
    document["subscriptions"]["local"] = {**core, "source": "memory", "queue": "q1"}
    found = jsonschema.Draft202012Validator(schema).iter_errors(document)
    assert [e.message for e in found] == []
