"""Class B on etcd: the fence is compared and written in one etcd transaction.

A real etcd member (:mod:`tests.support.etcd_server`) reached over its JSON gateway. Refusals
come from etcd's own compare; faults are real signals to the etcd process.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from bridge.demo.emulator import free_port
from bridge.errors import FencedOut
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import Ambiguous, Context, RetryLater, TerminalFailure
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.targets.etcd import EtcdClient, fence_key, fenced_put, stored_fence
from bridge.types import Delivery, Key, TargetClass
from tests.support.etcd_server import EtcdServer, etcd_server, require_etcd
from tests.support.etcd_worker import JOB_TYPE, SetValueInEtcd
from tests.support.worker_process import context_for

HASHER = IdentityHasher(b"etcd-target-tests-identity-secret")
LEASE = timedelta(seconds=30)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with etcd_server(require_etcd()) as server:
        yield server


@pytest.fixture
def key(request: pytest.FixtureRequest) -> bytes:
    """A key of this test's own: the module shares one server."""
    return f"fencebridge-test/{request.node.name}".encode()


def ctx(fence: int, operation_id: str = "op-1") -> Context:
    return Context(
        tenant_id="t1",
        operation_id=operation_id,
        job_type=JOB_TYPE,
        subscription="values",
        attempt=fence,
        max_attempts=5,
        fence=fence,
        payload=b"{}",
        derive_idempotency_key=lambda: HASHER.idempotency_key("t1", operation_id),
    )


def stored(etcd: EtcdServer, key: bytes) -> tuple[bytes | None, int | None]:
    return etcd.client.get(key), stored_fence(etcd.client, key)


@pytest.fixture
def paused(etcd: EtcdServer) -> Iterator[EtcdServer]:
    """The server SIGSTOPped: it accepts connections (the kernel does) and answers nothing."""
    etcd.pause()
    try:
        yield etcd
    finally:
        etcd.resume()


# -- the conditional write -----------------------------------------------------------------------


def test_a_higher_fence_applies_and_a_lower_one_is_refused_by_etcd(
    etcd: EtcdServer, key: bytes
) -> None:
    first = fenced_put(etcd.client, key, b"v5", ctx(5))
    assert stored(etcd, key) == (b"v5", 5)

    with pytest.raises(FencedOut) as refused:
        fenced_put(etcd.client, key, b"stale", ctx(4))
    assert (refused.value.fence, refused.value.action) == (4, "etcd put")
    assert stored(etcd, key) == (b"v5", 5), "unchanged"

    later = fenced_put(etcd.client, key, b"v6", ctx(6))
    assert later > first
    assert stored(etcd, key) == (b"v6", 6)
    with pytest.raises(FencedOut):
        fenced_put(etcd.client, key, b"stale", ctx(5))
    assert stored(etcd, key) == (b"v6", 6)


def test_an_equal_fence_is_refused_unless_the_same_claim_repeats_its_write(
    etcd: EtcdServer, key: bytes
) -> None:
    fenced_put(etcd.client, key, b"first", ctx(3))

    # Same fence number, another operation: not the claim that wrote it.
    with pytest.raises(FencedOut):
        fenced_put(etcd.client, key, b"intruder", ctx(3, operation_id="op-2"))
    assert stored(etcd, key) == (b"first", 3)

    # The same claim (operation and fence) may repeat its own write, as `<=` allows elsewhere.
    fenced_put(etcd.client, key, b"again", ctx(3))
    assert stored(etcd, key) == (b"again", 3)


def test_the_refusal_writes_nothing_and_names_no_identifier(etcd: EtcdServer, key: bytes) -> None:
    revision = fenced_put(etcd.client, key, b"v", ctx(2))
    with pytest.raises(FencedOut) as refused:
        fenced_put(etcd.client, key, b"stale", ctx(1))
    assert "op-1" not in str(refused.value)
    assert "t1" not in str(refused.value)
    # A refused transaction does not advance etcd's revision: nothing at all was written.
    assert fenced_put(etcd.client, key, b"v", ctx(2)) == revision + 1
    assert etcd.client.get(fence_key(key)) is not None
    assert b"op-1" not in (etcd.client.get(fence_key(key)) or b"")


def race(etcd: EtcdServer, key: bytes, fences: list[int]) -> dict[int, str]:
    """One thread per fence, released together, each putting its own value at ``key``."""
    start = threading.Barrier(len(fences))
    outcomes: dict[int, str] = {}

    def write(fence: int) -> None:
        start.wait()
        try:
            fenced_put(etcd.client, key, f"v{fence}", ctx(fence))
        except FencedOut:
            outcomes[fence] = "fenced_out"
        else:
            outcomes[fence] = "applied"

    threads = [threading.Thread(target=write, args=(f,)) for f in fences]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


@pytest.mark.parametrize("seed", range(3))
def test_concurrent_writers_with_different_fences_end_with_the_highest(
    etcd: EtcdServer, key: bytes, seed: int
) -> None:
    fences = list(range(1, 13))
    random.Random(seed).shuffle(fences)

    outcomes = race(etcd, key, fences)

    assert sorted(outcomes) == sorted(fences), "every writer got an answer"
    assert set(outcomes.values()) <= {"applied", "fenced_out"}
    assert outcomes[max(fences)] == "applied", "the highest fence is never refused"
    assert stored(etcd, key) == (f"v{max(fences)}".encode(), max(fences))


# -- what an uncertain answer means --------------------------------------------------------------


def test_a_write_nobody_answers_is_ambiguous(paused: EtcdServer, key: bytes) -> None:
    client = EtcdClient(paused.url, timeout=0.5)
    with pytest.raises(Ambiguous) as raised:
        fenced_put(client, key, b"maybe", ctx(1))
    assert raised.value.code == "etcd_ambiguous"


def test_a_write_that_cannot_connect_was_not_sent_and_is_retried(key: bytes) -> None:
    client = EtcdClient(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    with pytest.raises(RetryLater) as raised:
        fenced_put(client, key, b"never", ctx(1))
    assert raised.value.code == "etcd_unreachable"


def test_a_request_etcd_rejects_as_invalid_is_terminal_and_writes_nothing(
    etcd: EtcdServer,
) -> None:
    with pytest.raises(TerminalFailure) as raised:
        fenced_put(etcd.client, b"", b"no key", ctx(1))  # etcd: "key is not provided"
    assert raised.value.code == "etcd_rejected"
    assert etcd.client.get(fence_key(b"")) is None, "the whole transaction was refused"


def test_a_client_with_a_bad_url_fails_when_it_is_built() -> None:
    with pytest.raises(ValueError, match="etcd url"):
        EtcdClient("127.0.0.1:2379")


@pytest.mark.parametrize(
    ("max_attempts", "state"), [(3, "queued"), (1, "unknown")], ids=["retried", "last_attempt"]
)
def test_through_the_executor_an_ambiguous_write_is_retried_or_parked_unknown(
    store: PostgresStore, paused: EtcdServer, max_attempts: int, state: str
) -> None:
    """As for every class B target: retried under the next fence, unknown on the last attempt."""
    operation = f"op-{state}"
    store.inbox.ingest(
        [
            Delivery(
                tenant_id="t1",
                operation_id=operation,
                subscription="values",
                job_type=JOB_TYPE,
                target_class=TargetClass.B,
                payload=json.dumps({"value": "v"}).encode(),
                max_attempts=max_attempts,
            )
        ]
    )
    (claim,) = store.claims.claim_keys("w1", [Key("t1", operation)], LEASE)
    spec = Registry().register(
        JOB_TYPE, SetValueInEtcd(EtcdClient(paused.url, timeout=0.5)), lease=LEASE
    )
    events = EventCounter()
    execute(Run(store.settle, claim, spec, context_for(claim, HASHER), events))

    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT state, outcome_code FROM work_item WHERE operation_id = %s", (operation,)
        ).fetchone()
    assert row == (state, "etcd_ambiguous")
