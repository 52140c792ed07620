"""The store's shape: one database, and one object per table family on it.

:class:`~bridge.store.postgres.PostgresStore` holds no statement of its own: each family is its
own class with its own audience, handed out by the store, so a runtime module that holds the
claims cannot reach an operator query through them.
"""

from __future__ import annotations

from typing import Any, cast

from bridge.store import Database, PostgresStore
from bridge.store.claims import ClaimStore
from bridge.store.ingest import IngestStore
from bridge.store.keys import KeyStore
from bridge.store.listing import ConsoleQueries
from bridge.store.operator import OperatorQueries
from bridge.store.outbox import OutboxStore
from bridge.store.settle import SettleStore
from bridge.store.shadow import ShadowStore

FAMILIES = {
    "inbox": IngestStore,
    "claims": ClaimStore,
    "settle": SettleStore,
    "operator": OperatorQueries,
    "console": ConsoleQueries,
    "shadow": ShadowStore,
    "outbox": OutboxStore,
    "keys": KeyStore,
}


def public(cls: type) -> frozenset[str]:
    return frozenset(name for name in vars(cls) if not name.startswith("_"))


def test_the_store_is_the_database_and_hands_out_one_object_per_family() -> None:
    assert public(PostgresStore) == {"connect"}
    store = PostgresStore(cast(Any, object()))
    made = {name: type(value) for name, value in vars(store).items() if not name.startswith("_")}
    families = {name: kind for name, kind in made.items() if kind in FAMILIES.values()}
    assert families == FAMILIES
    shared = public(Database)
    assert all(not (public(kind) & shared) for kind in FAMILIES.values())
