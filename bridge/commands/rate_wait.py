"""``fencebridge rate-wait``: the targets' rate limit waits (``list``), and lifting one an
operator knows to be over (``clear``, audited like a redrive)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import KEY_NOTE, add_database_flag, stored_text
from bridge.commands.session import (
    identity_hasher,
    iso_time,
    keyed,
    moment,
    open_store,
    os_user,
    print_json,
    table,
)

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "rate-wait",
        help="the targets' rate limit waits: list them, or clear one that is over (audited)",
    )
    actions = p.add_subparsers(dest="rate_wait_command", required=True, metavar="ACTION")
    q = actions.add_parser(
        "list",
        help="the waits still ahead: job type, tenant hash, until when, rows held back",
        description=(
            "A handler's RateLimited (a 429 and its Retry-After) holds every row of its job "
            "type and tenant until the wait ends, at most the job type's "
            f"rate_limit_wait_max_seconds. {KEY_NOTE}"
        ),
    )
    q.add_argument("--job-type", type=stored_text, help="only this job type")
    q.add_argument("--json", action="store_true", help="print a JSON document instead")
    add_database_flag(q)
    q.set_defaults(run=list_waits)
    q = actions.add_parser(
        "clear",
        help="lift the waits of a job type (one tenant's, or every tenant's) now; audited",
        description=(
            "For a wait known to be over (the target's limit was raised, its Retry-After was "
            "wrong): the wait is deleted and the rows it had scheduled are due at once, each "
            "audited like a redrive (actor and reason in its redrive audit and its attempt "
            "history). A target that still limits answers 429 again, which starts a new wait. "
            f"{KEY_NOTE}"
        ),
    )
    q.add_argument("--job-type", type=stored_text, required=True, help="the job type")
    q.add_argument("--tenant", type=stored_text, help="only this tenant (default: every tenant)")
    q.add_argument("--reason", type=stored_text, required=True, help="why: recorded per row")
    q.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    q.add_argument("--dry-run", action="store_true", help="show what it would lift; write nothing")
    add_database_flag(q)
    q.set_defaults(run=clear)


def list_waits(args: argparse.Namespace) -> int:
    hasher = identity_hasher()  # tenants are shown by keyed hash only
    with open_store(args) as store:
        keyed(store, hasher)
        waits = store.operator.rate_waits(args.job_type)
    if args.json:
        print_json(
            {
                "waits": [
                    {
                        "job_type": w.job_type,
                        "tenant": hasher.tenant(w.tenant_id),
                        "until": iso_time(w.until),
                        "queued": w.queued,
                    }
                    for w in waits
                ]
            }
        )
        return 0
    if not waits:
        print("no rate limit wait is on")
        return 0
    rows = [[w.job_type, hasher.tenant(w.tenant_id), moment(w.until), w.queued] for w in waits]
    print("\n".join(table(["job_type", "tenant", "until", "queued"], rows)))
    return 0


def clear(args: argparse.Namespace) -> int:
    from bridge.operator.rate_waits import lift_rate_waits

    hasher = identity_hasher()
    with open_store(args, writes=True) as store:
        keyed(store, hasher)
        report = lift_rate_waits(
            store.operator,
            args.job_type,
            tenant_id=args.tenant,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    if not report.lifted:
        print("no rate limit wait of this selection is on: nothing lifted")
        return 1
    rows = [
        [w.job_type, hasher.tenant(w.tenant_id), moment(w.until), w.moved] for w in report.lifted
    ]
    lines = table(["job_type", "tenant", "would have waited until", "rows due now"], rows)
    verb = "would lift" if report.dry_run else "lifted"
    summary = f"{verb} {len(report.lifted)} wait(s); {report.moved} row(s) due now, each audited"
    if report.dry_run:
        summary += " (dry run: nothing was written)"
    print("\n".join([*lines, summary]))
    return 0
