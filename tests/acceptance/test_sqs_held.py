"""SQS ``after_outcome`` under volume, real-AWS receipt-handle rules and faults.

Two ``fencebridge run`` processes drain one queue through the SQS proxy (``tests/support/
sqs_proxy.py``) in front of moto's server (its own process): a replaced receipt handle deletes
nothing and cannot extend, an extension after the deadline is refused, as on AWS. Handlers work
for longer than the visibility timeout while reporting progress, so every delivery has to be
kept in flight by extensions, each from its own deadline. The backlog spans three tenants that
use the same operation ids, with duplicate sends and conflicting payloads mixed in.

What is checked is state afterwards, never timings: every operation succeeded and its target
was written once, under the fence that settled it; the conflicts, and only they, are recorded;
the queue is empty and the proxy saw no message left in flight; the proxy's count of receives per
message gives the redeliveries.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.handlers import create_tables
from tests.support.sqs_proxy import (
    ALL_FAULTS,
    RECEIVE,
    Fault,
    SqsProxy,
    sqs_proxy,
)
from tests.support.sqs_server import SqsServer, sqs_server_process
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone]

STEADY = "steady"
#: leases renewed by progress; long enough that a busy machine does not lapse them
STEADY_JOB = Job("tests.support.handlers:SteadyProgress", "B", lease_seconds=5.0)
TENANTS = ("t1", "t2", "t3")
#: operations per tenant (the same ids in every tenant)
PER_TENANT = 340
VISIBILITY = 5
WORK_SECONDS = 8
WORKERS = 50
DRAIN_SECONDS = 420.0


@dataclass(frozen=True, slots=True)
class Outgoing:
    tenant: str
    operation: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Backlog:
    messages: list[Outgoing]
    operations: set[tuple[str, str]]
    conflicts: set[tuple[str, str]]


def backlog(per_tenant: int, work_seconds: float, seed: int = 16) -> Backlog:
    """Operations over three tenants, 10% of them sent twice and 1% again with another payload."""
    rng = random.Random(seed)
    messages: list[Outgoing] = []
    operations: set[tuple[str, str]] = set()
    for tenant in TENANTS:
        for n in range(per_tenant):
            op = f"op-{n}"
            operations.add((tenant, op))
            messages.append(Outgoing(tenant, op, {"work_seconds": work_seconds, "step": 0.5}))
    ordered = sorted(operations)
    duplicates = rng.sample(ordered, len(ordered) // 10)
    conflicts = rng.sample([k for k in ordered if k not in set(duplicates)], len(ordered) // 100)
    for tenant, op in duplicates:
        messages.append(Outgoing(tenant, op, {"work_seconds": work_seconds, "step": 0.5}))
    for tenant, op in conflicts:
        messages.append(Outgoing(tenant, op, {"work_seconds": work_seconds, "variant": 2}))
    rng.shuffle(messages)
    return Backlog(messages, operations, set(conflicts))


def send_all(sqs: Any, queue_url: str, messages: Sequence[Outgoing]) -> None:
    def send(start: int) -> None:
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(m.body, sort_keys=True),
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": m.tenant},
                    "operation_id": {"DataType": "String", "StringValue": m.operation},
                    "job_type": {"DataType": "String", "StringValue": STEADY},
                },
            }
            for i, m in enumerate(messages[start : start + 10])
        ]
        answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not answer.get("Failed"), answer["Failed"]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(0, len(messages), 10)))


def on_queue(sqs: Any, queue_url: str) -> tuple[int, int]:
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def queue_empty(sqs: Any, queue_url: str) -> bool:
    """Empty on two reads in a row (moto counts visible and in-flight messages one by one)."""
    return on_queue(sqs, queue_url) == (0, 0) and on_queue(sqs, queue_url) == (0, 0)


def rows(url: str) -> dict[tuple[str, str], tuple[str, int]]:
    """(tenant, operation) -> (state, fence) of every work row."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT tenant_id, operation_id, state, fence FROM work_item")
        return {(t, o): (s, f) for t, o, s, f in found.fetchall()}


def succeeded(url: str, operations: set[tuple[str, str]]) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT tenant_id, operation_id FROM work_item WHERE state = 'succeeded'"
        ).fetchall()
    return len(operations & {(t, o) for t, o in found})


def targets(url: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(tenant, operation) -> (last fence, writes) of every class B target record."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT tenant_id, operation_id, last_fence, writes FROM test_target"
        ).fetchall()
    return {(t, o): (f, w) for t, o, f, w in found}


def conflicts_recorded(url: str) -> Counter[tuple[str, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT tenant_id, operation_id FROM rejected_delivery WHERE kind = 'conflict'"
        ).fetchall()
    return Counter((t, o) for t, o in found)


def timings(proxy: SqsProxy) -> dict[str, str]:
    """Median and p99 of moto's answer time per action, for a failure's message."""
    out = {}
    for action, values in proxy.timings.items():
        ordered = sorted(values)
        out[action] = (
            f"n={len(ordered)} p50={ordered[len(ordered) // 2] * 1000:.0f}ms"
            f" p99={ordered[int(len(ordered) * 0.99)] * 1000:.0f}ms"
        )
    return out


def redeliveries(proxy: SqsProxy, queue_url: str) -> int:
    return sum(n - 1 for n in proxy.receives(queue_url).values())


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server_process() as server:
        yield server


@pytest.fixture
def proxy(moto: SqsServer) -> Iterator[SqsProxy]:
    with sqs_proxy(moto.endpoint, seed=16, latency_seconds=2.0) as p:
        yield p


def bridge_config(proxy: SqsProxy, queue_url: str, name: str, **settings: Any) -> SqsBridgeConfig:
    values: dict[str, Any] = {
        "ack_mode": "after_outcome",
        "visibility_timeout_seconds": VISIBILITY,
        "worker_threads": WORKERS,
        "shutdown_deadline_seconds": 5.0,
        **settings,
    }
    return SqsBridgeConfig(
        queue_url=queue_url,
        endpoint_url=proxy.url,
        jobs={STEADY: STEADY_JOB},
        worker_id=name,
        **values,
    )


def start(config: SqsBridgeConfig, directory: Path, env: dict[str, str]) -> BridgeProcess:
    """A bridge from its own configuration file (two bridges of a test run side by side)."""
    path = config.write(directory, f"{config.worker_id}.toml")
    return BridgeProcess(path, env, health_port=config.health_port)


def assert_settled_once(db_url: str, work: Backlog, *, conflicts_exactly: bool) -> None:
    found = rows(db_url)
    assert set(found) == work.operations
    assert Counter(state for state, _ in found.values()) == {"succeeded": len(work.operations)}
    # One target write per operation, under the fence that settled it: settled once.
    assert targets(db_url) == {key: (fence, 1) for key, (_, fence) in found.items()}
    recorded = conflicts_recorded(db_url)
    assert set(recorded) == work.conflicts  # every conflict recorded, nothing else
    if conflicts_exactly:
        assert recorded == Counter(work.conflicts)


def drain(
    moto: SqsServer,
    proxy: SqsProxy,
    tmp_path: Path,
    db_url: str,
    work: Backlog,
) -> tuple[str, list[str]]:
    """Send the backlog, run two bridges until it is all settled and deleted; their logs."""
    create_tables(db_url)
    sqs = moto.client()
    queue_url = moto.create_queue("held", VisibilityTimeout=str(VISIBILITY))
    send_all(sqs, queue_url, work.messages)
    env = bridge_env(db_url, target_url=db_url)
    logs: list[str] = []
    with (
        start(bridge_config(proxy, queue_url, "b1"), tmp_path, env) as first,
        start(bridge_config(proxy, queue_url, "b2"), tmp_path, env) as second,
    ):
        eventually(
            lambda: (
                succeeded(db_url, work.operations) == len(work.operations)
                and queue_empty(sqs, queue_url)
            ),
            "every operation succeeded and the queue is empty",
            timeout=DRAIN_SECONDS,
            poll=1.0,
        )
        for bridge in (first, second):
            # the stream's counters (extended, let_go, broker_lease_lost, ...), for a failure
            logs.append(json.dumps(bridge.probe("/readyz")[1].get("checks", {})))
            assert bridge.terminate() == 0, bridge.logs()
            logs.append(bridge.logs())
    return queue_url, logs


def test_held_deliveries_settle_once_with_few_redeliveries(
    tmp_path: Path, moto: SqsServer, proxy: SqsProxy, db_url: str
) -> None:
    work = backlog(PER_TENANT, WORK_SECONDS)
    assert len(work.operations) >= 1000
    queue_url, logs = drain(moto, proxy, tmp_path, db_url, work)

    assert_settled_once(db_url, work, conflicts_exactly=False)
    received = proxy.receives(queue_url)
    assert len(received) == len(work.messages)  # every message sent was received ...
    assert proxy.deleted(queue_url) == len(work.messages)  # ... and deleted
    assert proxy.in_flight(queue_url) == 0
    assert queue_empty(moto.client(), queue_url)
    # Extensions kept up: each copy was extended from its own deadline, none too late. A copy
    # moto gave out again while its deadline (counted from moto's answer, as SQS counts it)
    # had not passed is moto's lag under load, not a late extension: it is bounded apart.
    redelivered = redeliveries(proxy, queue_url)
    early = proxy.counts["redelivered_in_flight"]
    assert redelivered - early < 0.02 * len(work.messages), (
        logs[0],
        logs[2],
        proxy.counts,
        timings(proxy),
        f"refused extensions came up to {max(proxy.late, default=0):.2f}s late",
    )
    assert redelivered < 0.10 * len(work.messages), (
        proxy.counts,
        timings(proxy),
        f"refused extensions came up to {max(proxy.late, default=0):.2f}s late",
    )
    assert proxy.counts["proxy_error"] == 0


def test_held_deliveries_survive_faults_on_a_tenth_of_the_calls(
    tmp_path: Path, moto: SqsServer, proxy: SqsProxy, db_url: str
) -> None:
    work = backlog(PER_TENANT, WORK_SECONDS, seed=17)
    # 500s, throttling, 2 s latency spikes and resets after forwarding, on 10% of every
    # receive, delete and visibility call.
    proxy.set_faults(0.10, kinds=ALL_FAULTS)
    queue_url, _ = drain(moto, proxy, tmp_path, db_url, work)
    proxy.clear_faults()

    assert_settled_once(db_url, work, conflicts_exactly=False)
    counts = proxy.counts
    for fault in Fault:
        assert sum(n for name, n in counts.items() if name.startswith(f"fault.{fault.value}.")), (
            f"no {fault.value} was injected: {counts}"
        )
    # Nothing lost, nothing left invisible: every message was deleted, none is in flight.
    assert len(proxy.receives(queue_url)) == len(work.messages)
    assert proxy.deleted(queue_url) == len(work.messages)
    assert proxy.in_flight(queue_url) == 0
    assert queue_empty(moto.client(), queue_url)
    assert counts["proxy_error"] == 0
    # What redeliveries there were came from the faults, not from extensions falling behind:
    # a receive whose answer a reset kept from the bridge hands out messages that can only come
    # back after their visibility, and moto's lag under load is bounded apart, as above.
    redelivered = redeliveries(proxy, queue_url)
    unheard = counts["unheard_received"]
    early = counts["redelivered_in_flight"]
    assert redelivered - unheard - early < 0.05 * len(work.messages), (
        f"{redelivered} redelivered, {unheard} unheard, {early} early",
        counts,
        timings(proxy),
        f"refused extensions came up to {max(proxy.late, default=0):.2f}s late",
    )


def test_sigterm_hands_back_unwritten_and_held_deliveries_at_once(
    tmp_path: Path, moto: SqsServer, proxy: SqsProxy, db_url: str
) -> None:
    create_tables(db_url)
    sqs = moto.client()
    # A visibility far beyond the test's waits: a message the stopping bridge did not hand back
    # would still be in flight when it has exited, and the second bridge could not finish.
    visibility = 600
    queue_url = moto.create_queue("sigterm", VisibilityTimeout=str(visibility))
    work = backlog(100, 3.0, seed=18)
    send_all(sqs, queue_url, work.messages)
    env = bridge_env(db_url, target_url=db_url)
    # Long enough a shutdown for the running handlers to finish: what is left is only what
    # the consumer hands back.
    settings = {
        "visibility_timeout_seconds": visibility,
        "worker_threads": 8,
        "shutdown_deadline_seconds": 20.0,
    }

    with start(bridge_config(proxy, queue_url, "b1", **settings), tmp_path, env) as first:
        # Many held at once (the workers run only eight of them).
        eventually(lambda: proxy.in_flight(queue_url) >= 100, "deliveries held")
        # Every receive from now on waits 2 s before it reaches the broker: the one in flight
        # when the bridge stops returns messages after the stop began, never to be written.
        proxy.set_faults(1.0, kinds=[Fault.LATENCY], actions=frozenset({RECEIVE}))
        eventually(lambda: proxy.counts["fault.latency.ReceiveMessage"] >= 1, "a delayed receive")
        held = proxy.in_flight(queue_url)
        stopped_at = time.monotonic()
        assert first.terminate() == 0, first.logs()
        # It waited for its receives: one still open after it exits would take what the stop
        # handed back and keep it invisible for the whole visibility timeout.
        assert proxy.receiving == 0
    proxy.clear_faults()

    # The stopped bridge left nothing in flight: what it held and what its last receive
    # returned were handed back (visibility 0), not left to their 600 s visibility.
    assert proxy.in_flight(queue_url) == 0
    assert proxy.counts["released"] >= held - proxy.deleted(queue_url)
    after_stop = [n for at, q, n in proxy.answered if q == queue_url and at > stopped_at]
    assert sum(after_stop) > 0, "no receive returned messages after the stop began"
    received_by_first = sum(proxy.receives(queue_url).values())

    # A second bridge takes everything over now, the handed-back messages included.
    settings["worker_threads"] = 40  # the second has nothing to hold back for
    with start(bridge_config(proxy, queue_url, "b2", **settings), tmp_path, env) as second:
        eventually(
            lambda: (
                succeeded(db_url, work.operations) == len(work.operations)
                and queue_empty(sqs, queue_url)
            ),
            "the second bridge settled everything",
            timeout=DRAIN_SECONDS,
            poll=0.5,
        )
        assert second.terminate() == 0, second.logs()
    assert sum(proxy.receives(queue_url).values()) > received_by_first
    assert_settled_once(db_url, work, conflicts_exactly=False)
    assert proxy.deleted(queue_url) == len(work.messages)
    assert proxy.in_flight(queue_url) == 0
    assert proxy.counts["proxy_error"] == 0
