"""Erasing one operation as an operator would, for tests that need a tombstone."""

from __future__ import annotations

from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.store.records import ErasureCounts


def erase_operation(
    store: PostgresStore, hasher: IdentityHasher, tenant: str, operation: str
) -> ErasureCounts:
    """Erase one settled operation, hashed under ``hasher`` (the key the store holds)."""
    return store.operator.erase(
        tenant,
        operation_id=operation,
        tenant_hash=hasher.tenant(tenant),
        operation_hash=hasher.operation(tenant, operation),
        actor="dpo",
        reason="request",
    )
