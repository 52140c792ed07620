"""A store with another claim policy on the same database: a policy is fixed when a store
opens, so a test that claims under limits, rates or fairness opens one beside the fixture's."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.store.work import ConcurrencyLimit, TokenRate


def with_policy(
    store: PostgresStore,
    *,
    concurrency: Mapping[str, ConcurrencyLimit] | None = None,
    rates: Mapping[str, TokenRate] | None = None,
    fairness: Mapping[str, int] | None = None,
) -> PostgresStore:
    """``store``'s pool, clock, settings and identity keys, with the claim policy it has but
    for what is given here."""
    had = store.claims.policy
    made = PostgresStore(
        store.pool,
        clock=store.now,
        attempt_history=store.attempt_history,
        priority_aging=timedelta(seconds=store.aging),
        policy=ClaimPolicy(
            concurrency=had.concurrency if concurrency is None else concurrency,
            rates=had.rates if rates is None else rates,
            fairness=had.fairness if fairness is None else fairness,
        ),
    )
    if store.identity_key is not None and store.identity_keys is not None:
        made.use_identity_keys(store.identity_key, store.identity_keys, store.erased_hashes)
    return made
