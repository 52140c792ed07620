"""``fencebridge sweep``: park expired last attempts as unknown now, one sweeper at a time (a
class D claim that expired before its call goes back to the queue instead)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, positive
from bridge.commands.session import log_hashes, open_store, optional_hasher

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "sweep", help="park expired last attempts as unknown now (one sweeper at a time)"
    )
    p.add_argument("--limit", type=positive, default=1000, help="most rows parked by this sweep")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args, writes=True) as store:
        hasher = optional_hasher(store)
        swept = store.settle.sweep(args.limit, exclusive=True)
    print(f"parked {len(swept.parked)} expired last attempt(s) as unknown")
    if swept.parked and hasher is not None:
        for t in swept.parked:
            print(f"  {' '.join(log_hashes(hasher, t.key))}  fence {t.fence}")
    if swept.requeued:
        print(
            f"queued again {len(swept.requeued)} class D claim(s) that expired before their "
            "call (no intent recorded: the target was never called)"
        )
    if swept.requeued and hasher is not None:
        for t in swept.requeued:
            print(f"  {' '.join(log_hashes(hasher, t.key))}  fence {t.fence}")
    return 0
