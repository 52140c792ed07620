"""``fencebridge resolve``: close rejected deliveries a person has dealt with (audited; the
work rows are untouched)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import (
    KEY_NOTE,
    add_database_flag,
    audit_text,
    positive,
    stored_text,
    usage,
)
from bridge.commands.session import (
    identity_hasher,
    keyed,
    log_hashes,
    moment,
    open_store,
    os_user,
    table,
)

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "resolve",
        help="close rejected deliveries a person has dealt with (audited; work rows untouched)",
        description=(
            "A conflict (same operation id, another payload) changed nothing; once its producer "
            "has been told, resolve it so it stops awaiting a person. A quarantined delivery "
            "given up on is resolved the same way (redrive re-decodes one instead). Each is "
            f"marked acknowledged with actor and reason; nothing else changes. {KEY_NOTE}"
        ),
    )
    p.add_argument(
        "ids", nargs="*", type=positive, metavar="ID", help="rejected delivery ids (inspect)"
    )
    p.add_argument(
        "--reason", type=audit_text, required=True, help="why: recorded on each delivery"
    )
    p.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    p.add_argument("--dry-run", action="store_true", help="show what would close; write nothing")
    p.add_argument("--kind", choices=["conflict", "quarantined"], help="only this kind")
    p.add_argument("--subscription", type=stored_text, help="only this subscription")
    p.add_argument("--tenant", type=stored_text, help="only this tenant")
    p.add_argument("--operation", type=stored_text, help="only this operation (with --tenant)")
    p.add_argument("--limit", type=positive, default=100, help="most deliveries per run")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.operator.resolve import RejectionFilter, resolve

    if args.operation is not None and args.tenant is None:
        raise usage("--operation needs --tenant")
    if not args.ids and args.kind is None and args.subscription is None and args.tenant is None:
        raise usage(
            "name the deliveries: their ids (shown by `fencebridge inspect`), or a filter "
            "(--kind, --subscription, --tenant); a resolve never closes everything by default"
        )
    selection = RejectionFilter(
        ids=tuple(args.ids) if args.ids else None,
        kind=args.kind,
        subscription=args.subscription,
        tenant_id=args.tenant,
        operation_id=args.operation,
        limit=args.limit,
    )
    hasher = identity_hasher()  # the output names operations by keyed hash only
    with open_store(args, writes=True) as store:
        keyed(store, hasher)
        report = resolve(
            store.operator,
            selection,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    verb = "would resolve" if report.dry_run else "resolved"
    rows = [
        [
            f"#{r.id}",
            r.kind,
            r.subscription,
            "-" if r.key is None else " ".join(log_hashes(hasher, r.key)),
            moment(r.created_at),
        ]
        for r in report.resolved
    ]
    lines = table(["delivery", "kind", "subscription", "operation", "recorded"], rows)
    if not rows:
        lines = ["no open rejected delivery matches"]
    lines += [f"#{i}: not resolved: {why}" for i, why in report.not_open]
    summary = f"{verb} {len(report.resolved)} rejected deliveries; work rows untouched"
    if report.dry_run:
        summary += " (dry run: nothing was written)"
    print("\n".join([*lines, summary]))
    return 1 if report.not_open else 0
