"""``fencebridge erase``: one tenant's rows, payloads, rejected deliveries and audit rows,
erased and recorded by the tenant's keyed hash."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import KEY_NOTE, add_database_flag, stored_text
from bridge.commands.session import identity_hasher, keyed, open_store, os_user

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "erase",
        help="erase one tenant: work rows, payloads, rejected deliveries, audit rows (audited)",
        description=f"The erasure is recorded with the tenant's keyed hash. {KEY_NOTE}",
    )
    p.add_argument("--tenant", type=stored_text, required=True, help="the tenant id to erase")
    p.add_argument(
        "--reason", type=stored_text, required=True, help="why (the request reference): recorded"
    )
    p.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    p.add_argument("--dry-run", action="store_true", help="count what would go; erase nothing")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    hasher = identity_hasher()
    with open_store(args) as store:
        keyed(store, hasher, record=None if args.dry_run else "erase")
        tenant_hash = hasher.tenant(args.tenant)
        counts = store.erase_tenant(
            args.tenant,
            tenant_hash=tenant_hash,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    verb = "would erase" if args.dry_run else "erased"
    print(
        f"{verb} tenant {tenant_hash}: {counts.work_rows} work row(s), {counts.payloads} "
        f"payload(s), {counts.rejected_deliveries} rejected deliveries, "
        f"{counts.redrive_audits} redrive audit row(s)"
    )
    print("dry run: nothing was written" if args.dry_run else "recorded in erasure_audit")
    return 0
