"""``fencebridge demo``: the whole protocol on an embedded database, a local broker and a
payment provider.

The command lives with the demo, not in the core: ``fencebridge`` finds it under the
``fencebridge.commands`` entry point group (pyproject.toml), so no module of ``bridge`` imports
the demo. What the demo needs beyond the bridge (an embedded PostgreSQL, a local SQS server)
is the ``demo`` extra; without it the command says what to install.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.commands.arguments import usage

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "demo",
        help="the whole protocol on an embedded PostgreSQL, a local SQS and a payment provider",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep everything running afterwards, write bridge.toml and demo.env for the "
        "operator commands and print what to try (Ctrl-C stops it)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        help="with --keep: the directory for bridge.toml and demo.env (created if missing; "
        "default: a fresh temporary directory, removed on exit)",
    )
    p.add_argument(
        "--broker",
        choices=("sqs", "pubsub"),
        default="sqs",
        help="sqs: a local SQS server (moto); pubsub: Google's Pub/Sub emulator (needs Java)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="no scenario: start an embedded PostgreSQL, a local SQS and (when installed) the "
        "Pub/Sub emulator for your own bridge, write local.env and bridge.toml into --dir, and "
        "run until Ctrl-C (docs/tutorial.md)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.demo import scenario  # noqa: PLC0415  (keeps `fencebridge --help` fast)

    if args.local:
        from bridge.demo import local  # noqa: PLC0415

        return local.run(args.dir or Path("local"))
    if args.dir is not None and not args.keep:
        raise usage("--dir names where --keep writes its files: add --keep, or drop --dir")
    return scenario.run(broker=args.broker, keep=args.keep, directory=args.dir)
