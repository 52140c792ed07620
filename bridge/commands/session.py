"""What the commands share once parsed: a store, the identity keys, tables and JSON.

Every command that reads the work store opens it here, small and closed with the command;
every command that shows a tenant or an operation compares the environment's identity keys
with the database's first (:func:`keyed`), so a hash is never shown under the wrong key.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
from collections.abc import Sequence
from contextlib import closing
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bridge.database import database_url
from bridge.identity import IDENTITY_KEY_ENV

if TYPE_CHECKING:
    from bridge.identity import IdentityHasher
    from bridge.store import PostgresStore
    from bridge.store.reach import Grants
    from bridge.types import Key


def open_store(
    args: argparse.Namespace, *, writes: bool = False, grants: Grants | None = None
) -> closing[PostgresStore]:
    """A small store for one command, closed when the ``with`` block ends.

    The database is reached first (:func:`bridge.store.reach.reach`): a server that is down, a
    misnamed database, a schema not migrated and missing grants each end the command in one
    line. A command that ``writes`` needs the bridge's grants (it runs with the bridge's
    credentials); one that reads, an operator's; ``grants`` names any other set.
    """
    from bridge.store import PostgresStore
    from bridge.store.reach import BRIDGE_GRANTS, READ_GRANTS, reach

    url = database_url(args.database_url)
    reach(url, grants if grants is not None else BRIDGE_GRANTS if writes else READ_GRANTS)
    return closing(PostgresStore.connect(url, max_size=2))


def identity_hasher() -> IdentityHasher:
    from bridge.identity import IdentityHasher

    return IdentityHasher.from_env()


def keyed(store: PostgresStore, hasher: IdentityHasher, *, record: str | None = None) -> None:
    """Compare the environment's identity keys with the database's before any hash is shown or
    key derived, and bind the key ids for commands (``record`` names the command) that write
    hashes or derive idempotency keys; no command records a first key (``identity init``
    does)."""
    from bridge import keyring

    if record is None:
        keyring.verify(store.keys, hasher)
    else:
        keyring.attach(store.keys, hasher, used_by=f"fencebridge {record}", first_use=False)


def optional_hasher(store: PostgresStore) -> IdentityHasher | None:
    """The compared keys when the environment sets one; None for commands that can do without."""
    if not os.environ.get(IDENTITY_KEY_ENV):
        return None
    hasher = identity_hasher()
    keyed(store, hasher)
    return hasher


def log_hashes(hasher: IdentityHasher, key: Key) -> list[str]:
    """The tenant's and the operation's keyed hashes, as logs and spans carry them."""
    return [hasher.tenant(key.tenant_id), hasher.operation(key.tenant_id, key.operation_id)]


def os_user() -> str:
    """The actor an audit record names when the operator gives none."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def moment(value: datetime | None) -> str:
    """A time for a table: to the second, or ``-`` when there is none."""
    return value.isoformat(timespec="seconds") if value is not None else "-"


def iso_time(value: datetime | None) -> str | None:
    """A time for a JSON document: ISO 8601, or null when there is none."""
    return value.isoformat() if value is not None else None


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Left-aligned columns two spaces apart, the header first."""
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def print_json(document: Any) -> None:
    """A JSON document on stdout; a value JSON has no type for is written as its text."""
    print(json.dumps(document, indent=2, default=str))
