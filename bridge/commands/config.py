"""``fencebridge config schema``: the configuration file's JSON Schema, for editors.

taplo and Even Better TOML check ``bridge.toml`` against a JSON Schema as it is typed: save
this output and point them at it (a ``#:schema bridge.schema.json`` first line, or the
editor's schema association). The schema covers every installed source.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser("config", help="the configuration file: its JSON Schema")
    actions = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    q = actions.add_parser(
        "schema",
        help="print the JSON Schema of the configuration file (for taplo, Even Better TOML)",
    )
    q.set_defaults(run=schema)


def schema(_args: argparse.Namespace) -> int:
    from bridge.config import config_schema

    sys.stdout.write(json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n")
    return 0
