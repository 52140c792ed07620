"""The ``fencebridge`` command line.

Settings come from flags or from ``FENCEBRIDGE_*`` environment variables; secrets (the
database URL) only from the environment or a flag, never from the subscription file.
Exit codes: 0 success, 1 a fencebridge error the message explains, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from bridge.database import DATABASE_URL_ENV, connect, database_url
from bridge.errors import FenceBridgeError
from bridge.identity import IDENTITY_KEY_ENV
from bridge.migrate import current_version, migrate

Command = Callable[[argparse.Namespace], int]


def _migrate(args: argparse.Namespace) -> int:
    with connect(database_url(args.database_url)) as conn:
        applied = migrate(conn)
        version = current_version(conn)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("nothing to apply")
    print(f"schema version {version}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from bridge.config import load_config  # noqa: PLC0415  (keeps `--help` fast)
    from bridge.identity import IdentityHasher  # noqa: PLC0415
    from bridge.runtime import open_bridge  # noqa: PLC0415

    config = load_config(args.config)
    bridge = open_bridge(config, database_url(args.database_url), IdentityHasher.from_env())
    try:
        bridge.run_until_signalled()
    finally:
        bridge.store.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from bridge.demo import scenario  # noqa: PLC0415

    return scenario.run(keep=args.keep)


def _add_database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help=f"libpq URL of the database (default: ${DATABASE_URL_ENV})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencebridge",
        description="Broker deliveries become fenced work rows in PostgreSQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "migrate", help="apply the schema migrations (idempotent; an operator's command)"
    )
    _add_database_flag(p)
    p.set_defaults(run=_migrate)

    p = commands.add_parser(
        "run",
        help="run the bridge: consumers, worker pool, sweeper (SIGTERM/SIGINT drain and exit 0)",
        description=(
            f"Secrets come from the environment: ${DATABASE_URL_ENV} and ${IDENTITY_KEY_ENV} "
            "(the key of idempotency keys and of hashed identifiers in logs; never change it "
            "while operations may be retried)."
        ),
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    _add_database_flag(p)
    p.set_defaults(run=_run)

    p = commands.add_parser(
        "demo",
        help="the whole protocol on an embedded PostgreSQL, a local SQS and a payment provider",
    )
    p.add_argument("--keep", action="store_true", help="keep everything running afterwards")
    p.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run: Command = args.run
    try:
        return run(args)
    except FenceBridgeError as exc:
        print(f"fencebridge {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
