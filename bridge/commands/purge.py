"""``fencebridge purge``: finished work older than an age, removed in bounded batches (never
unknown or quarantined rows), what shadow subscriptions recorded before that age, and outbox
messages sent before it (never pending or parked ones)."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, duration, positive, usage
from bridge.commands.session import open_store
from bridge.errors import ConfigError
from bridge.store.work import TOMBSTONE_DAYS_DEFAULT

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.operator.retention import Stream


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "purge",
        help="delete finished rows and their payloads by age, in batches (never unknown or "
        "quarantined)",
    )
    age = p.add_mutually_exclusive_group(required=True)
    age.add_argument("--older-than", type=duration, help="age since settlement: 90d, 36h, 30m")
    age.add_argument("--config", help="take the age from [retention] purge_after_days")
    p.add_argument(
        "--tombstone-days",
        type=positive,
        help="age (since erasure) past which erased operations' tombstones go (default: "
        f"[retention] tombstone_days with --config, else {TOMBSTONE_DAYS_DEFAULT})",
    )
    p.add_argument("--batch-size", type=positive, default=500, help="rows per batch transaction")
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help="purge even when the age or the tombstone horizon is within a broker's redelivery "
        "window (refused otherwise: a redelivery of a purged operation would run it again)",
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.operator.purge import purge

    older_than: timedelta | None = args.older_than
    tombstone_days: int = args.tombstone_days or TOMBSTONE_DAYS_DEFAULT
    streams: list[Stream] | None = None
    if older_than is None:
        from bridge.config import load_config

        config = load_config(args.config)
        plan = config.retention
        if plan is None:
            raise usage(f"{args.config} has no [retention] table; pass --older-than")
        older_than = timedelta(days=plan.purge_after_days)
        tombstone_days = args.tombstone_days or plan.tombstone_days
        streams = [(s.name, s.source) for s in config.subscriptions.values()]
    horizon = timedelta(days=tombstone_days)
    if not args.force:
        _refuse_within_redelivery(older_than, horizon, streams)
    with open_store(args, writes=True) as store:
        outbox = store.outbox
        if args.dry_run:
            counts = store.operator.purge_preview(older_than, tombstone_horizon=horizon)
            print(
                f"would purge {counts.work_rows} work row(s), {counts.rejected_deliveries} "
                f"rejected deliveries and {counts.payloads} payload(s) older than "
                f"{_span(older_than)}, and {counts.tombstones} tombstone(s) older than "
                f"{tombstone_days}d"
            )
            print(
                f"would purge {counts.shadow_deliveries} shadow delivery record(s) and "
                f"{counts.shadow_operations} shadow operation record(s) older than "
                f"{_span(older_than)}"
            )
            print(f"would purge {outbox.purge_preview(older_than)} sent outbox message(s)")
            return 0
        report = purge(
            store.operator, older_than, batch_size=args.batch_size, tombstone_horizon=horizon
        )
        sent = outbox.purge(older_than, args.batch_size)
    removed = report.removed
    print(
        f"purged {removed.work_rows} work row(s), {removed.rejected_deliveries} rejected "
        f"deliveries and {removed.payloads} payload(s) older than {_span(older_than)}, and "
        f"{removed.tombstones} tombstone(s) older than {tombstone_days}d in "
        f"{report.batches} batch(es)"
    )
    print(
        f"purged {removed.shadow_deliveries} shadow delivery record(s) and "
        f"{removed.shadow_operations} shadow operation record(s) older than {_span(older_than)}"
    )
    print(f"purged {sent} sent outbox message(s) older than {_span(older_than)}")
    if report.locked_out:
        print("fencebridge purge: another purge is running; this one stopped", file=sys.stderr)
        return 1
    return 0


def _refuse_within_redelivery(
    older_than: timedelta, horizon: timedelta, streams: list[Stream] | None
) -> None:
    """Refuse, before anything is deleted, a purge that ``fencebridge check`` would call no-go:
    its age or its tombstone horizon within the redelivery window of the configuration's
    subscriptions, or of any installed source when no configuration names them."""
    from bridge.operator.retention import every_installed_source, within_redelivery

    hint = "pass --force"
    if streams is None:
        streams = every_installed_source()
        hint = "name the configuration (--config) to compare with its subscriptions only, " + hint
    problems = within_redelivery(older_than, horizon, streams)
    if problems:
        raise ConfigError(f"refused, nothing deleted: {'; '.join(problems)} ({hint})")


def _span(age: timedelta) -> str:
    """A purge age as the operator wrote it: 30d, 12h or 90m."""
    minutes = int(age.total_seconds()) // 60
    if minutes % (24 * 60) == 0:
        return f"{minutes // (24 * 60)}d"
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"
