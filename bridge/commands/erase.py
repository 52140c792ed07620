"""``fencebridge erase``: one tenant (or one of its operations) erased, a tombstone kept per
operation so a later redelivery is a replay, never new work; recorded by keyed hashes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import KEY_NOTE, add_database_flag, stored_text
from bridge.commands.session import identity_hasher, keyed, open_store, os_user
from bridge.identity import IDENTITY_KEY_ENV

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "erase",
        help="erase one tenant or one operation: payloads, rejected deliveries, audit rows and "
        "identifiers go, a tombstone per operation stays (audited)",
        description=(
            "Each erased operation leaves a tombstone (keyed hashes under every identity key "
            "held, payload hash, state, outcome code, time of erasure) so a redelivery is a "
            "replay or a conflict, never new work; tombstones are purged after [retention] "
            "tombstone_days. Refused while an operation in scope is queued or claimed, or one "
            "of its outbox messages is not sent yet (pending, or parked without "
            "--drop-parked-messages). The erasure is recorded with the tenant's (and "
            f"operation's) keyed hash. {KEY_NOTE} During a key rotation, hold the earlier key "
            "too: a bridge still running on it then finds the tombstones."
        ),
    )
    p.add_argument("--tenant", type=stored_text, required=True, help="the tenant id to erase")
    p.add_argument(
        "--operation",
        type=stored_text,
        help="erase only this operation of the tenant (a request that names one order)",
    )
    p.add_argument(
        "--reason", type=stored_text, required=True, help="why (the request reference): recorded"
    )
    p.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    p.add_argument(
        "--drop-parked-messages",
        action="store_true",
        help="erase the scope's parked outbox messages (never sent) with it, counted and "
        "recorded; without it they refuse the erasure",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go; erase nothing")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    hasher = identity_hasher()
    with open_store(args, writes=True) as store:
        if args.dry_run:
            # compares the keys and records nothing; with no key recorded yet, this one will be
            # key 1 (the first use records it so)
            keyed(store, hasher)
            if hasher.key_id is None:
                store.use_identity_keys(1, [1], hasher.erased_operation_candidates)
        else:
            keyed(store, hasher, record="erase")
        tenant_hash = hasher.tenant(args.tenant)
        operation_hash = (
            None if args.operation is None else hasher.operation(args.tenant, args.operation)
        )
        counts = store.operator.erase(
            args.tenant,
            operation_id=args.operation,
            tenant_hash=tenant_hash,
            operation_hash=operation_hash,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
            drop_parked_messages=args.drop_parked_messages,
        )
    verb = "would erase" if args.dry_run else "erased"
    scope = f"tenant {tenant_hash}" + (f" operation {operation_hash}" if operation_hash else "")
    print(
        f"{verb} {scope}: {counts.work_rows} work row(s), {counts.payloads} payload(s), "
        f"{counts.rejected_deliveries} rejected deliveries, {counts.redrive_audits} redrive "
        f"audit row(s); {counts.tombstones} tombstone(s) kept"
    )
    print(
        f"outbox: {counts.outbox_sent} sent message(s) removed, {counts.outbox_parked} parked "
        "message(s) dropped, never sent"
    )
    keys = ", ".join(f"key {k}" for k in counts.tombstone_keys)
    print(f"tombstones hashed under every identity key held: {keys}")
    if counts.missed_keys:
        missed = ", ".join(f"key {k}" for k in counts.missed_keys)
        print(
            f"no tombstone under {missed}: a bridge still running with no other identity key "
            "(started before a rotation) "
            + ("would refuse" if args.dry_run else "refuses from now on")
            + f" to write new work, until restarted with the current {IDENTITY_KEY_ENV}"
        )
    print("dry run: nothing was written" if args.dry_run else "recorded in erasure_audit")
    return 0
