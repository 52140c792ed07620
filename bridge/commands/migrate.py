"""``fencebridge migrate``: apply the schema migrations (an operator's command, never the
bridge's own)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag
from bridge.database import connect, database_url
from bridge.store.migrate import current_version, migrate

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "migrate", help="apply the schema migrations (idempotent; an operator's command)"
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.store.reach import NO_GRANTS, reach

    url = database_url(args.database_url)
    reach(url, NO_GRANTS, schema=False, create=True)
    with connect(url) as conn:
        applied = migrate(conn)
        version = current_version(conn)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("nothing to apply")
    print(f"schema version {version}")
    return 0
