"""The store's shape: the runtime's interface reaches no operator query, and the PostgreSQL
store offers the runtime's statements and the table families, nothing else.

mypy checks the signatures (``bridge.store`` assigns the PostgreSQL store to the runtime's
interface); this checks which methods each side has.
"""

from __future__ import annotations

from bridge.store import Database, KeyedStore, PostgresStore, WorkStore
from bridge.store.listing import ConsoleQueries
from bridge.store.operator import OperatorQueries
from bridge.store.shadow import ShadowStore

#: what every family shares: the pool's connections, the clock, the fenced write
DATABASE = frozenset(name for name in vars(Database) if not name.startswith("_"))


def members(protocol: type) -> frozenset[str]:
    """The public names a protocol declares, its bases' included."""
    return frozenset(
        name
        for cls in protocol.__mro__
        if getattr(cls, "_is_protocol", False)
        for name in vars(cls)
        if not name.startswith("_")
    )


def public(cls: type) -> frozenset[str]:
    return frozenset(name for name in vars(cls) if not name.startswith("_"))


def test_the_runtime_store_offers_no_operator_console_or_shadow_query() -> None:
    others = public(OperatorQueries) | public(ConsoleQueries) | public(ShadowStore)
    assert members(WorkStore) & others == set()


def test_every_method_of_the_postgres_store_belongs_to_the_runtime_interface() -> None:
    # waiting: the rows the claim policy holds back, read with that policy
    mine = public(PostgresStore) - {"connect", "waiting"}
    assert mine - members(WorkStore) == set()
    assert members(WorkStore) - members(KeyedStore) <= mine | DATABASE
