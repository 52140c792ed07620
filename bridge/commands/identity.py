"""``fencebridge identity``: the identity keys the database was written under (``status``,
needs no key), the deployment's first key (``init``), replacing a key nothing was written
under (``reset``, audited) and rotation (``rotate``, audited)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, stored_text
from bridge.commands.session import (
    identity_hasher,
    iso_time,
    moment,
    open_store,
    os_user,
    print_json,
    table,
)
from bridge.identity import IDENTITY_KEY_ENV

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "identity",
        help="the identity keys the database was written under: status, init, reset, rotate",
        description=(
            f"Each {IDENTITY_KEY_ENV} is recorded in the database by its fingerprint (never the "
            "key); every row keeps the key it was written under."
        ),
    )
    identity = p.add_subparsers(dest="identity_command", required=True, metavar="ACTION")
    q = identity.add_parser(
        "status",
        help="recorded keys: id, fingerprint prefix, open and total rows, which one this "
        "environment holds (needs no key)",
    )
    q.add_argument("--json", action="store_true", help="print a JSON document instead")
    add_database_flag(q)
    q.set_defaults(run=status)
    q = identity.add_parser(
        "init",
        help="record the deployment's key (the first step on a new database; audited)",
        description=(
            f"Run once, with {IDENTITY_KEY_ENV} set to the deployment's key (from the secret "
            "store, e.g. `openssl rand -hex 32` kept there): `fencebridge run` and the commands "
            "refuse a database with no key recorded. Running it again with the same key "
            "changes nothing; another key is refused."
        ),
    )
    q.add_argument("--reason", type=stored_text, required=True, help="why: recorded with the key")
    q.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    add_database_flag(q)
    q.set_defaults(run=init)
    q = identity.add_parser(
        "reset",
        help="replace a key recorded by mistake, while nothing was written under it (audited)",
        description=(
            f"Replaces the one recorded key with {IDENTITY_KEY_ENV}, only while no work row, "
            "intent, rejected delivery, tombstone, shadow record or outbox message was written "
            "under it and no other fencebridge process is connected; recorded in "
            "identity_key_reset (who, why, both fingerprints). Run it as the role that owns the "
            "tables (the migrator's)."
        ),
    )
    q.add_argument("--reason", type=stored_text, required=True, help="why: recorded")
    q.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    q.add_argument("--dry-run", action="store_true", help="check everything; change nothing")
    add_database_flag(q)
    q.set_defaults(run=reset)
    q = identity.add_parser(
        "rotate",
        help="record a new current key for new operations; existing rows keep theirs (audited)",
        description=(
            f"Run with {IDENTITY_KEY_ENV} set to the new key and "
            "FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS to the current key (comma-separated, with any "
            "earlier key that open rows still use). Then restart every bridge with the same two "
            "variables."
        ),
    )
    q.add_argument("--reason", type=stored_text, required=True, help="why: recorded with the key")
    q.add_argument("--actor", type=stored_text, help="who: recorded (default: the OS user)")
    q.add_argument("--dry-run", action="store_true", help="check everything; record nothing")
    add_database_flag(q)
    q.set_defaults(run=rotate)


def status(args: argparse.Namespace) -> int:
    from bridge import keyring
    from bridge.identity import REUSE_ADVICE, IdentityHasher, shown

    hasher = IdentityHasher.optional_from_env()
    with open_store(args) as store:
        uses = keyring.status(store.keys, hasher)
    current = next((u for u in uses if u.current), None)
    fine = current is not None and (hasher is None or current.held == "current")
    if args.json:
        document = {
            "keys": [
                {
                    "key_id": u.key.key_id,
                    "fingerprint": shown(u.key.fingerprint),
                    "current": u.current,
                    "registered_at": moment(u.key.registered_at),
                    "registered_by": u.key.registered_by,
                    "reason": u.key.reason,
                    "open_rows": u.open_rows,
                    "rows": u.rows,
                    "environment": u.held,
                    "missed_erasure_at": iso_time(u.key.missed_erasure_at),
                }
                for u in uses
            ],
            "environment_fingerprint": shown(hasher.fingerprint) if hasher else None,
        }
        print_json(document)
        return 0 if fine or hasher is None else 1
    if not uses:
        print(
            "no identity key recorded yet: `fencebridge identity init --reason TEXT` records the "
            "deployment's key (bridges and commands refuse until then)"
        )
        print(f"{REUSE_ADVICE[0].upper()}{REUSE_ADVICE[1:]}")
        return 0
    rows = [
        [
            u.key.key_id,
            shown(u.key.fingerprint),
            "current" if u.current else "earlier",
            moment(u.key.registered_at),
            u.key.registered_by,
            u.open_rows,
            u.rows,
            u.held or "-",
        ]
        for u in uses
    ]
    header = ["key", "fingerprint", "use", "recorded", "by", "open rows", "rows", "environment"]
    print("\n".join(table(header, rows)))
    for u in uses:
        if u.key.missed_erasure_at is not None:
            print(
                f"key {u.key.key_id}: erasures since {moment(u.key.missed_erasure_at)} left "
                "tombstones under other keys only: a bridge running with no other key writes "
                "no new work"
            )
    assert current is not None
    if hasher is None:
        print(f"{IDENTITY_KEY_ENV} is not set: {REUSE_ADVICE}")
    elif current.held != "current":
        print(
            f"{IDENTITY_KEY_ENV} (fingerprint {shown(hasher.fingerprint)}) is not the current key "
            f"(key {current.key.key_id}): {REUSE_ADVICE}"
        )
    return 0 if fine or hasher is None else 1


def rotate(args: argparse.Namespace) -> int:
    from bridge import keyring
    from bridge.identity import IDENTITY_PREVIOUS_KEYS_ENV, shown

    hasher = identity_hasher()
    with open_store(args, writes=True) as store:
        rotation = keyring.rotate(
            store.keys,
            hasher,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    new = rotation.new
    assert new is not None
    verb = "would record" if rotation.dry_run else "recorded"
    print(f"{verb} key {new.key_id} (fingerprint {shown(new.fingerprint)}) as the current key")
    for k in rotation.previous:
        print(
            f"key {k.key_id} (fingerprint {shown(k.fingerprint)}) keeps its "
            f"{rotation.open_rows.get(k.key_id, 0)} open row(s) and every row written under it"
        )
    if rotation.dry_run:
        print("dry run: nothing was written")
        return 0
    print(
        f"next: restart every bridge, and run every command, with {IDENTITY_KEY_ENV} set to the "
        f"new key and {IDENTITY_PREVIOUS_KEYS_ENV} to the earlier key(s); until restarted, a "
        "bridge keeps working on its own key's rows and refuses to start again, and keeps "
        "writing new work as long as every erasure holds its key too"
    )
    return 0


def init(args: argparse.Namespace) -> int:
    from bridge.database import connect, database_url
    from bridge.identity import shown
    from bridge.operator.identity_setup import MEANING
    from bridge.operator.identity_setup import init as record
    from bridge.store.reach import reach

    hasher = identity_hasher()
    url = database_url(args.database_url)
    reach(url, {"identity_key": ("SELECT", "INSERT")})
    with connect(url) as conn:
        done = record(conn, hasher, actor=args.actor or os_user(), reason=args.reason)
    if not done.new:
        print(f"{done.key.describe()} is already recorded: nothing changed")
        return 0
    print(f"recorded {done.key.describe()}, fingerprint {shown(done.key.fingerprint)}")
    print(MEANING)
    return 0


def reset(args: argparse.Namespace) -> int:
    from bridge.database import connect, database_url
    from bridge.operator.identity_setup import reset as replace
    from bridge.store.reach import reach

    hasher = identity_hasher()
    url = database_url(args.database_url)
    reach(url, {"identity_key": ("SELECT", "INSERT", "DELETE"), "identity_key_reset": ("INSERT",)})
    with connect(url) as conn:
        done = replace(
            conn,
            hasher,
            actor=args.actor or os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    verb = "would replace" if done.dry_run else "replaced"
    print(f"{verb} {done.replaced.describe()} (unused) with {done.key.describe()}")
    if done.dry_run:
        print("dry run: nothing was changed")
    return 0
