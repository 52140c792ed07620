"""``fencebridge shadow``: what shadow subscriptions recorded, set against the existing system's
effect log (``report``), and forgetting a finished comparison (``clear``)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack, closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.commands.arguments import KEY_NOTE, add_database_flag, positive, usage
from bridge.commands.session import identity_hasher, keyed, open_store, print_json, table
from bridge.operator.shadow import LISTED_DEFAULT

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.identity import IdentityHasher
    from bridge.operator.shadow import Comparison, JobComparison
    from bridge.types import Key

_COLUMNS = (
    "job type",
    "deliveries",
    "operations",
    "replays",
    "conflicts",
    "undecodable",
    "applied >1",
    "other payload",
    "never applied",
)
#: what the existing system did that fencebridge would not have: (field, title)
_FINDINGS = (
    ("applied_more_than_once", "applied more than once"),
    ("applied_with_other_payload", "applied with another payload"),
    ("never_applied", "never applied"),
)


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "shadow",
        help="compare shadow subscriptions with the existing system's effect log: report, clear",
    )
    shadow = p.add_subparsers(dest="shadow_command", required=True, metavar="ACTION")
    q = shadow.add_parser(
        "report",
        help="per job type: what the inbox saw and caught, and what the existing system applied "
        "twice, with another payload, or never",
        description=(
            "The effect log holds one entry per effect the existing system applied, with the "
            "columns tenant, operation, applied_at and optionally payload_hash (hex sha256 of "
            "the payload bytes the subscription hashes): a .csv file with a header, a .jsonl "
            "file, or a table or view of the bridge's database. Operations are shown as keyed "
            f"hashes. {KEY_NOTE}"
        ),
    )
    q.add_argument("--config", required=True, help="the bridge's TOML configuration")
    source = q.add_mutually_exclusive_group(required=True)
    source.add_argument("--effects", type=Path, help="the effect log: a .csv or .jsonl file")
    source.add_argument(
        "--effects-table", help="the effect log as a table or view: table or schema.table"
    )
    q.add_argument(
        "--subscription",
        action="append",
        help="a shadow subscription to report (repeatable; default: every shadow subscription "
        "of the configuration)",
    )
    q.add_argument(
        "--limit",
        type=positive,
        default=LISTED_DEFAULT,
        help="operations listed per finding and job type, in key order (default "
        f"{LISTED_DEFAULT}; every one is counted)",
    )
    q.add_argument("--json", action="store_true", help="print a JSON document instead")
    q.add_argument(
        "--reveal",
        action="store_true",
        help="print raw tenant and operation ids instead of keyed hashes (to stdout only; for "
        "an operator who holds the key)",
    )
    add_database_flag(q)
    q.set_defaults(run=report)
    q = shadow.add_parser(
        "clear", help="forget what one shadow subscription recorded (a comparison that is over)"
    )
    q.add_argument("--subscription", required=True, help="the shadow subscription's name")
    add_database_flag(q)
    q.set_defaults(run=clear)


def report(args: argparse.Namespace) -> int:
    from bridge.config import load_config
    from bridge.operator.shadow import (
        SORT_RUN_DEFAULT,
        compare,
        effect,
        in_key_order,
        read_effect_file,
    )
    from bridge.store.shadow import SHADOW_PAGE_DEFAULT

    config = load_config(args.config)
    shadows = [n for n, s in config.subscriptions.items() if s.shadow]
    names: list[str] = args.subscription or shadows
    if not names:
        raise usage(f'{args.config} has no subscription with mode = "shadow"')
    unknown = [n for n in names if n not in shadows]
    if unknown:
        raise usage(f"not a shadow subscription of {args.config}: {', '.join(unknown)}")
    hasher = identity_hasher()
    with ExitStack() as stack:
        if args.effects is not None:
            log = stack.enter_context(closing(read_effect_file(args.effects)))
        store = stack.enter_context(open_store(args))
        keyed(store, hasher)
        decisions = store.shadow.decisions(names)
        # What the report holds at once, whatever the size of the record and the log: a page
        # of each query, a run of a log file being sorted, and the listed operations.
        page, run = SHADOW_PAGE_DEFAULT, SORT_RUN_DEFAULT
        if args.effects is None:
            table_rows = store.shadow.effect_table(args.effects_table, page=page)
            rows = stack.enter_context(closing(table_rows))
            where = args.effects_table
            effects = (effect(r, f"{where} row {n}") for n, r in enumerate(rows, start=1))
        else:
            effects = stack.enter_context(closing(in_key_order(log, run=run)))
        seen = stack.enter_context(closing(store.shadow.operations(names, page=page)))
        result = compare(decisions, seen, effects, limit=args.limit)
    document = _document(result, names, hasher, reveal=args.reveal)
    if args.json:
        print_json(document)
        return 0
    rows_out = [
        [
            name,
            j["deliveries"],
            j["operations"],
            j["replays"],
            j["conflicts"],
            j["undecodable"],
            *(j["totals"][finding] for finding, _ in _FINDINGS),
        ]
        for name, j in document["job_types"].items()
    ]
    print(f"shadow subscriptions: {', '.join(names)}")
    print("\n".join(table(_COLUMNS, rows_out)))
    for name, j in document["job_types"].items():
        for finding, title in _FINDINGS:
            for op in j[finding]:
                times = f" ({op['times']} times)" if "times" in op else ""
                print(f"{name}: {title}: tenant {op['tenant']} operation {op['operation']}{times}")
            left = j["totals"][finding] - len(j[finding])
            if left:
                print(f"{name}: {title}: {left} more, not listed (--limit {args.limit})")
    print(
        f"effects of operations no shadow subscription saw: {document['effects_not_seen']}; "
        f"effects without a payload hash (payload not compared): "
        f"{document['effects_without_hash']}"
    )
    return 0


def _document(
    result: Comparison, names: list[str], hasher: IdentityHasher, *, reveal: bool
) -> dict[str, Any]:
    def ident(key: Key) -> dict[str, str]:
        if reveal:
            return {"tenant": key.tenant_id, "operation": key.operation_id}
        return {
            "tenant": hasher.tenant(key.tenant_id),
            "operation": hasher.operation(key.tenant_id, key.operation_id),
        }

    def job(j: JobComparison) -> dict[str, Any]:
        more, other, never = j.applied_more_than_once, j.applied_with_other_payload, j.never_applied
        return {
            "deliveries": j.deliveries,
            "operations": j.operations,
            "replays": j.replays,
            "conflicts": j.conflicts,
            "undecodable": j.undecodable,
            "applied_more_than_once": [{**ident(k), "times": n} for k, n in more.first],
            "applied_with_other_payload": [ident(k) for k, _ in other.first],
            "never_applied": [ident(k) for k, _ in never.first],
            "totals": {
                "applied_more_than_once": more.total,
                "applied_with_other_payload": other.total,
                "never_applied": never.total,
            },
        }

    return {
        "subscriptions": names,
        "identifiers": "raw" if reveal else "keyed hashes",
        "listed_per_finding": result.limit,
        "job_types": {name: job(j) for name, j in result.job_types.items()},
        "effects_not_seen": result.effects_not_seen,
        "effects_without_hash": result.effects_without_hash,
    }


def clear(args: argparse.Namespace) -> int:
    with open_store(args, writes=True) as store:
        operations, deliveries = store.shadow.clear(args.subscription)
    print(
        f"cleared shadow subscription {args.subscription}: {operations} operation(s), "
        f"{deliveries} deliveries"
    )
    return 0
