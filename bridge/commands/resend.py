"""``fencebridge resend``: parked outbox messages back to the relay, each move audited."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, positive, stored_text, usage
from bridge.commands.session import open_store, os_user, table

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.store.outbox import Resent


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "resend",
        help="send parked outbox messages again, with their ids (audited)",
        description=(
            "parked outbox messages go back to pending, oldest parked first, with the same "
            "message ids (a consumer that has one drops the copy) and no failed send counted; "
            "the relay sends them in its next rounds. Fix what parked them first (the reason "
            "is shown). Shows message ids and destinations only, never an identifier or a body."
        ),
    )
    p.add_argument("--reason", type=stored_text, required=True, help="why: recorded in the audit")
    p.add_argument(
        "--actor", type=stored_text, help="who: recorded in the audit (default: the OS user)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="count and show what would go back; write nothing",
    )
    p.add_argument("--destination", type=stored_text, help="only this outbox destination")
    p.add_argument("--tenant", type=stored_text, help="only this tenant's messages")
    p.add_argument("--operation", type=stored_text, help="only this operation's (with --tenant)")
    p.add_argument(
        "--message",
        type=stored_text,
        action="append",
        help="only this message id (repeatable)",
    )
    p.add_argument("--limit", type=positive, default=100, help="most messages per run")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.store.outbox import ParkedSelection

    if args.operation is not None and args.tenant is None:
        raise usage("--operation needs --tenant")
    selection = ParkedSelection(
        destination=args.destination,
        tenant_id=args.tenant,
        operation_id=args.operation,
        message_ids=args.message,
    )
    with open_store(args, writes=True) as store:
        resend = store.outbox
        matching = resend.parked(selection)
        moved = resend.resend(
            selection,
            actor=args.actor or os_user(),
            reason=args.reason,
            limit=args.limit,
            dry_run=args.dry_run,
        )
    print("\n".join(_lines(moved, matching, dry_run=args.dry_run)))
    return 0


def _lines(moved: list[Resent], matching: int, *, dry_run: bool) -> list[str]:
    if not moved:
        return [f"nothing parked matches ({matching} parked message(s) matched)"]
    lines = table(
        ["message", "destination", "failed sends", "parked because"],
        [[m.message_id, m.destination, m.attempts, m.park_reason or "-"] for m in moved],
    )
    left = max(matching - len(moved), 0)
    if dry_run:
        summary = (
            f"resend: {len(moved)} of {matching} matching parked message(s) would go back to "
            "pending (dry run: nothing was written)"
        )
    else:
        summary = f"resend: {len(moved)} parked message(s) back to pending, {left} left parked"
    return [*lines, summary]
