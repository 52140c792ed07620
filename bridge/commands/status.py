"""``fencebridge status``: counts by state per subscription and tenant hash, stalled claims,
the oldest unknown, the rejected deliveries awaiting a person, and the due rows that wait (over
a concurrency limit, under a rate limit wait or with no token left) per job type and tenant
hash, and the outbox's backlog per destination (pending messages, the oldest one's age, parked
messages)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from bridge.commands.arguments import KEY_NOTE, add_database_flag
from bridge.commands.session import identity_hasher, keyed, open_store, print_json, table
from bridge.operator.views import status_view
from bridge.types import State

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.identity import IdentityHasher
    from bridge.store import PostgresStore
    from bridge.store.work import ConcurrencyLimit, TokenRate, WaitingCount

_STATES = tuple(s.value for s in State)
#: why a due row is not claimed: over a concurrency limit, under a rate limit wait or a token
#: rate with no token left
_REASONS = ("limit", "rate")


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "status",
        help="counts by state per subscription and tenant hash; stalled claims; oldest unknown",
        description=KEY_NOTE,
    )
    p.add_argument("--json", action="store_true", help="print a JSON document instead")
    p.add_argument(
        "--config",
        help="the bridge's TOML configuration: its job types' concurrency limits and token "
        "rates decide which due rows wait for a slot or a token (without it, only rate limit "
        "waits are shown)",
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    hasher = identity_hasher()  # refuse before touching the database: status shows hashes only
    limits, rates = _limits(args.config)
    with open_store(args) as store:
        keyed(store, hasher)
        stats = store.operator.stats()
        waiting = store.operator.waiting(limits, rates)
        outbox = _outbox(store)
    document = status_view(stats, hasher.tenant)
    document["waiting"] = _waiting_document(waiting, hasher)
    document["outbox"] = outbox
    if args.json:
        print_json(document)
        return 0
    rows = [
        [c["subscription"], c["tenant"], *(c["states"][s] for s in _STATES)]
        for c in document["counts"]
    ]
    rows.append(["total", "", *(document["totals"][s] for s in _STATES)])
    print("\n".join(table(["subscription", "tenant", *_STATES], rows)))
    print()
    print(f"stalled claims (lease expired, still claimed): {stats.stalled_claims}")
    print(f"oldest unknown: {_age(stats.oldest_unknown_seconds)}")
    rejected = stats.rejected
    print(
        f"rejected deliveries awaiting a person: {rejected.get('conflict', 0)} conflict, "
        f"{rejected.get('quarantined', 0)} quarantined"
    )
    if any(rejected.values()):
        print(
            "  see them with `fencebridge inspect TENANT OPERATION`; close them with "
            "`fencebridge resolve` (conflicts) or `fencebridge redrive` (quarantined)"
        )
    print()
    if not document["waiting"]:
        print("due rows waiting: none")
    else:
        print(
            "due rows waiting (limit: over a concurrency limit; rate: a rate limit wait or "
            "no token left)"
        )
        rows = [
            [w["job_type"], w["tenant"], *(w["reasons"][r] for r in _REASONS)]
            for w in document["waiting"]
        ]
        print("\n".join(table(["job_type", "tenant", *_REASONS], rows)))
    print()
    if not outbox:
        print("outbox: nothing pending or parked")
        return 0
    print("outbox (messages committed by class A handlers, sent by the relay)")
    rows = [
        [o["destination"], o["pending"], _age(o["oldest_pending_seconds"]), o["parked"]]
        for o in outbox
    ]
    print("\n".join(table(["destination", "pending", "oldest pending", "parked"], rows)))
    return 0


def _outbox(store: PostgresStore) -> list[dict[str, Any]]:
    """The outbox backlog per destination (destination names only, never an identifier)."""
    return [
        {
            "destination": d.destination,
            "pending": d.pending,
            "oldest_pending_seconds": d.oldest_pending_seconds,
            "parked": d.parked,
        }
        for d in store.outbox.depth()
    ]


def _limits(path: str | None) -> tuple[dict[str, ConcurrencyLimit], dict[str, TokenRate]]:
    """The configuration's concurrency limits and token rates; none without a file (no row
    waits on one)."""
    if path is None:
        return {}, {}
    from bridge.config import load_config

    config = load_config(path)
    return config.concurrency_limits(), config.token_rates()


def _waiting_document(waiting: list[WaitingCount], hasher: IdentityHasher) -> list[dict[str, Any]]:
    """Waiting rows per job type and tenant hash (never the tenant id), by reason."""
    grouped: dict[tuple[str, str], dict[str, int]] = {}
    for w in waiting:
        key = (w.job_type, hasher.tenant(w.tenant_id))
        grouped.setdefault(key, dict.fromkeys(_REASONS, 0))[w.reason] += w.count
    return [
        {"job_type": job, "tenant": tenant, "reasons": reasons}
        for (job, tenant), reasons in sorted(grouped.items())
    ]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {int(seconds) % 60}s"
