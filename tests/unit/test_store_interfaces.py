"""The store's two interfaces: the runtime's cannot reach an operator query, and the PostgreSQL
store offers nothing outside them.

mypy checks the signatures (``bridge.store`` assigns the PostgreSQL store to both); this
checks which methods each interface has.
"""

from __future__ import annotations

from bridge.store import KeyedStore, OperatorStore, PostgresStore, WorkStore

#: what only a person asks for: histories, parked work and the moves made on it
OPERATOR_QUERIES = frozenset(
    {
        "close_rejected",
        "erase",
        "erasures",
        "history",
        "lift_rate_waits",
        "parked",
        "purge_batch",
        "purge_preview",
        "quarantined_deliveries",
        "rate_waits",
        "redrive",
        "redrive_applied",
        "redrive_unfenced",
        "rejected_status",
        "resolve_rejected",
        "waiting",
    }
)
#: what both sides need: a redrive writes re-decoded deliveries as the inbox does, and both
#: read the counts and may sweep
SHARED = frozenset({"ingest", "stats", "sweep"})
#: the table families the store hands out, each its own class
FAMILIES = frozenset({"console", "keys", "outbox", "shadow"})


def members(protocol: type) -> frozenset[str]:
    """The public names a protocol declares, its bases' included."""
    return frozenset(
        name
        for cls in protocol.__mro__
        if getattr(cls, "_is_protocol", False)
        for name in vars(cls)
        if not name.startswith("_")
    )


def test_the_runtime_store_offers_no_operator_query() -> None:
    assert members(WorkStore) & OPERATOR_QUERIES == set()


def test_the_operator_store_offers_the_operator_queries_and_no_protocol_write() -> None:
    keyed = members(KeyedStore)
    assert members(OperatorStore) - keyed == OPERATOR_QUERIES | SHARED


def test_every_method_of_the_postgres_store_belongs_to_an_interface() -> None:
    public = (
        {
            name
            for cls in PostgresStore.__mro__[:-1]
            for name in vars(cls)
            if not name.startswith("_")
        }
        - {
            "connect",
            "connection",
            "fenced_write",
            "guarded_write",
            "pool",
            "wait",
        }
        - FAMILIES
    )
    assert public - (members(WorkStore) | members(OperatorStore)) == set()
    assert members(WorkStore) | members(OperatorStore) <= public
