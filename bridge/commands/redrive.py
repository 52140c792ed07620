"""``fencebridge redrive``: parked work back to the queue, reconciled first, each move
audited."""

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
from bridge.commands.session import identity_hasher, keyed, log_hashes, open_store, os_user, table
from bridge.types import State

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.identity import IdentityHasher
    from bridge.operator.redrive import RedriveReport
    from bridge.types import Key


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "redrive",
        help="send parked work back, reconciling unknown rows first (audited)",
        description=(
            "unknown class C rows are looked up by idempotency key first (applied -> succeeded, "
            "not applied -> queued, cannot tell -> stays); unknown class D rows with a "
            "recorded intent stay unless --confirm-not-called; class A/B unknown and "
            "quarantined rows go back to the queue; quarantined deliveries are decoded again "
            f"with the current rules. {KEY_NOTE}"
        ),
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    p.add_argument("--reason", type=audit_text, required=True, help="why: recorded in the audit")
    p.add_argument(
        "--actor", type=stored_text, help="who: recorded in the audit (default: the OS user)"
    )
    p.add_argument("--dry-run", action="store_true", help="show what would happen; write nothing")
    p.add_argument(
        "--state",
        action="append",
        choices=["unknown", "quarantined"],
        help="parked state to redrive (repeatable; default both; quarantined includes "
        "quarantined deliveries)",
    )
    p.add_argument("--subscription", type=stored_text, help="only this subscription")
    p.add_argument("--tenant", type=stored_text, help="only this tenant")
    p.add_argument("--operation", type=stored_text, help="only this operation (with --tenant)")
    p.add_argument("--job-type", type=stored_text, help="only this job type")
    p.add_argument("--limit", type=positive, default=100, help="most rows (and deliveries) per run")
    p.add_argument(
        "--extra-attempts",
        type=positive,
        default=1,
        help="attempts granted to each row (default 1)",
    )
    p.add_argument(
        "--confirm-not-called",
        action="store_true",
        help="class D: the target's owner confirmed the recorded call did not happen; clears "
        "the intent of the one operation named by --tenant and --operation",
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.config import load_config
    from bridge.operator.redrive import Redrive
    from bridge.types import Key, RedriveFilter

    if args.operation is not None and args.tenant is None:
        raise usage("--operation needs --tenant")
    if args.confirm_not_called and args.operation is None:
        raise usage("--confirm-not-called applies to one operation: give --tenant and --operation")
    states = tuple(State(s) for s in (args.state or ["unknown", "quarantined"]))
    selection = RedriveFilter(
        states=states,
        subscription=args.subscription,
        tenant_id=args.tenant,
        job_type=args.job_type,
        keys=(Key(args.tenant, args.operation),) if args.operation is not None else None,
        limit=args.limit,
    )
    config = load_config(args.config)
    hasher = identity_hasher()
    with open_store(args, writes=True) as store:
        # a dry run compares the key but records nothing, not even a first key
        keyed(store, hasher, record=None if args.dry_run else "redrive")
        report = Redrive(
            store,
            config,
            hasher,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
            extra_attempts=args.extra_attempts,
            confirm_not_called=args.confirm_not_called,
        ).run(selection, deliveries=State.QUARANTINED in states)
    print("\n".join(_redrive_lines(report, hasher)))
    return 0


def _redrive_lines(report: RedriveReport, hasher: IdentityHasher) -> list[str]:
    def who(key: Key | None) -> str:
        return "-" if key is None else " ".join(log_hashes(hasher, key))

    verb = "would go" if report.dry_run else "->"
    rows: list[list[object]] = []
    for r in report.rows:
        result = f"{verb} {r.to.value}" if r.to is not None else "stays"
        rows.append(
            [
                r.row.state.value,
                r.row.target_class.value,
                r.row.job_type,
                who(r.row.key),
                result,
                r.note,
            ]
        )
    for d in report.deliveries:
        if d.decision is None or d.decision.value == "quarantined":
            result = "stays"
        else:
            result = f"{verb} {d.decision.value}"
        note = (
            d.note
            if d.decision is None or d.decision.value != "quarantined"
            else (f"still quarantined: {d.note}")
        )
        rows.append(
            [f"delivery #{d.delivery.id}", "", d.delivery.subscription, who(d.key), result, note]
        )
    lines = table(["parked", "class", "job / subscription", "operation", "result", "why"], rows)
    if not rows:
        lines = ["nothing parked matches"]
    summary = f"redrive: {report.moved} moved, {report.left} left parked"
    if report.dry_run:
        summary += " (dry run: nothing was written)"
    return [*lines, summary]
