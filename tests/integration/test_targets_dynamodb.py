"""Class B on DynamoDB: the fence travels in the request's ConditionExpression.

DynamoDB is moto's server on loopback, reached over real HTTP by boto3 (dummy credentials).
The item stores ``last_fence``; a write carrying a lower fence is refused by the table itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from bridge.errors import FencedOut
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, Success
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.targets.dynamodb import fenced_put, fenced_update
from bridge.types import Claim, Delivery, Key, TargetClass
from tests.support.clock import Clock
from tests.support.worker_process import context_for

REGION = "eu-west-1"
LEASE = timedelta(seconds=30)
ITEM_KEY = {"tenant_id": "t1", "operation_id": "op-1"}


@pytest.fixture(scope="module")
def dynamodb_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def table(dynamodb_url: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh table per test: partition key tenant_id, sort key operation_id."""
    resource = boto3.resource(
        "dynamodb",
        endpoint_url=dynamodb_url,
        region_name=REGION,
        aws_access_key_id="test",
        aws_secret_access_key="test",  # moto accepts any credentials
    )
    name = f"balances-{request.node.name}"[:255].replace("[", "-").replace("]", "")
    created = resource.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": "tenant_id", "KeyType": "HASH"},
            {"AttributeName": "operation_id", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "tenant_id", "AttributeType": "S"},
            {"AttributeName": "operation_id", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    created.wait_until_exists()
    try:
        yield created
    finally:
        created.delete()


def ctx(fence: int) -> Context:
    return Context(
        tenant_id="t1",
        operation_id="op-1",
        job_type="set_balance",
        subscription="balances",
        attempt=fence,
        max_attempts=5,
        fence=fence,
        payload=b"{}",
    )


def item(table: Any) -> dict[str, Any] | None:
    found: dict[str, Any] | None = table.get_item(Key=ITEM_KEY, ConsistentRead=True).get("Item")
    return found


# -- fenced_put and fenced_update --------------------------------------------------------------


@pytest.mark.promise("fence-refusal")
def test_fenced_put_refuses_a_lower_fence_and_accepts_equal_or_higher(table: Any) -> None:
    fenced_put(table, {**ITEM_KEY, "balance": 100}, ctx(5))
    assert item(table) == {**ITEM_KEY, "balance": 100, "last_fence": 5}

    with pytest.raises(FencedOut):
        fenced_put(table, {**ITEM_KEY, "balance": 999}, ctx(4))
    assert item(table) == {**ITEM_KEY, "balance": 100, "last_fence": 5}, "unchanged"

    fenced_put(table, {**ITEM_KEY, "balance": 200}, ctx(5))  # the same claim repeats its write
    assert item(table) == {**ITEM_KEY, "balance": 200, "last_fence": 5}
    fenced_put(table, {**ITEM_KEY, "balance": 300}, ctx(6))
    assert item(table) == {**ITEM_KEY, "balance": 300, "last_fence": 6}


def test_fenced_update_refuses_a_lower_fence_and_accepts_equal_or_higher(table: Any) -> None:
    fenced_update(table, ITEM_KEY, {"balance": 100, "currency": "eur"}, ctx(3))
    assert item(table) == {**ITEM_KEY, "balance": 100, "currency": "eur", "last_fence": 3}

    with pytest.raises(FencedOut) as refused:
        fenced_update(table, ITEM_KEY, {"balance": 999}, ctx(2))
    assert (refused.value.fence, refused.value.action) == (2, "dynamodb update")
    assert item(table) == {**ITEM_KEY, "balance": 100, "currency": "eur", "last_fence": 3}

    fenced_update(table, ITEM_KEY, {"balance": 150}, ctx(3))
    fenced_update(table, ITEM_KEY, {"currency": "usd"}, ctx(4))
    assert item(table) == {**ITEM_KEY, "balance": 150, "currency": "usd", "last_fence": 4}


def test_a_refused_write_does_not_leak_identifiers_into_its_message(table: Any) -> None:
    fenced_put(table, {**ITEM_KEY, "balance": 1}, ctx(2))
    with pytest.raises(FencedOut) as refused:
        fenced_put(table, {**ITEM_KEY, "balance": 2}, ctx(1))
    assert "op-1" not in str(refused.value)
    assert "t1" not in str(refused.value)


# -- through the class B executor ----------------------------------------------------------------


class SetBalanceInDynamo(ConditionalWriteHandler):
    """Sets the balance an operation asks for, on an item keyed by the operation."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def handle(self, ctx: Context) -> Success:
        balance = ctx.json()["balance"]
        key = {"tenant_id": ctx.tenant_id, "operation_id": ctx.operation_id}
        fenced_update(self._table, key, {"balance": balance}, ctx)
        return Success("balance_set")


@pytest.fixture
def stale_and_current(store: PostgresStore, table: Any) -> tuple[PostgresStore, Claim, Claim]:
    """One operation claimed, its lease lapsed, claimed again: (store, stale, current)."""
    clock = Clock(datetime(2024, 2, 3, 4, 5, tzinfo=UTC))
    clocked = PostgresStore(store.pool, clock=clock)
    clocked.inbox.ingest(
        [
            Delivery(
                tenant_id="t1",
                operation_id="op-1",
                subscription="balances",
                job_type="set_balance",
                target_class=TargetClass.B,
                payload=json.dumps({"balance": 4200}).encode(),
            )
        ]
    )
    (stale,) = clocked.claims.claim_keys("paused", [Key("t1", "op-1")], LEASE)
    clock.advance(LEASE * 2)
    (current,) = clocked.claims.claim_keys("rescuer", [Key("t1", "op-1")], LEASE)
    assert (stale.fence, current.fence) == (1, 2)
    return clocked, stale, current


def run(store: PostgresStore, table: Any, claim: Claim) -> dict[str, int]:
    registry = Registry()
    spec = registry.register("set_balance", SetBalanceInDynamo(table))
    hasher = IdentityHasher(b"dynamodb-tests-identity-secret")
    events = EventCounter()
    execute(Run(store.settle, claim, spec, context_for(claim, hasher), events))
    return events.snapshot()


def work_row(store: PostgresStore) -> tuple[Any, ...] | None:
    with store.pool.connection() as conn:
        return conn.execute(
            "SELECT state, fence, outcome_code FROM work_item WHERE operation_id = 'op-1'"
        ).fetchone()


def test_stale_claim_waking_after_the_new_one_wrote_is_fenced_out_by_the_table(
    stale_and_current: tuple[PostgresStore, Claim, Claim], table: Any
) -> None:
    store, stale, current = stale_and_current

    assert run(store, table, current) == {"settled.succeeded": 1}
    assert run(store, table, stale) == {"fenced_out": 1}

    assert item(table) == {**ITEM_KEY, "balance": 4200, "last_fence": 2}
    assert work_row(store) == ("succeeded", 2, "balance_set")


def test_stale_claim_writing_first_is_superseded_and_cannot_settle(
    stale_and_current: tuple[PostgresStore, Claim, Claim], table: Any
) -> None:
    store, stale, current = stale_and_current

    # The target accepts fence 1 (it has seen nothing higher), but the work row refuses it.
    assert run(store, table, stale) == {"lease_lost": 1}
    assert item(table) == {**ITEM_KEY, "balance": 4200, "last_fence": 1}
    assert work_row(store) == ("claimed", 2, None)

    assert run(store, table, current) == {"settled.succeeded": 1}
    assert item(table) == {**ITEM_KEY, "balance": 4200, "last_fence": 2}
    assert work_row(store) == ("succeeded", 2, "balance_set")
