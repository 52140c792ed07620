"""Running ``fencebridge run`` processes on the emulator at volume, and reading what they did.

The helpers of the Pub/Sub acceptance tests: publish a backlog, start two bridges on one
subscription, read each bridge's stream counters from its ``/readyz`` detail, wait until every
delivery was answered, and read the work rows and effects the run left behind.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.support.bridge_process import BridgeProcess, bridge_env
from tests.support.pubsub_bridge import Backlog, Publication, PubSubBridgeConfig
from tests.support.pubsub_emulator import EMULATOR_HOST_ENV, PubSubEmulator
from tests.support.waiting import eventually

DRAIN_SECONDS = 300.0
#: how long nothing new must arrive after a refused ack: the client's exactly-once lease floor
#: plus the ack deadline
QUIET_SECONDS = 75.0
_COUNT = re.compile(r"([a-z_]+) (\d+)")


def publish(emulator: PubSubEmulator, topic: str, pubs: list[Publication]) -> None:
    publisher = emulator.publisher()
    futures = [
        publisher.publish(topic, p.data, ordering_key=p.ordering_key, **p.attributes) for p in pubs
    ]
    for f in futures:
        f.result(timeout=120)


def counts(bridge: BridgeProcess) -> Counter[str]:
    """The subscription's stream counters, read from the bridge's /readyz detail."""
    _, body = bridge.probe("/readyz")
    found: Counter[str] = Counter()
    for name, reason in body.get("checks", {}).items():
        if name.startswith("subscription:"):
            found.update({k: int(v) for k, v in _COUNT.findall(reason)})
    return found


def total(bridges: list[BridgeProcess]) -> Counter[str]:
    summed: Counter[str] = Counter()
    for b in bridges:
        summed.update(counts(b))
    return summed


def work_rows(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {str(s): int(n) for s, n in rows}


def effects_per_operation(db_url: str, table: str) -> Counter[tuple[str, str]]:
    column = "count(*)" if table == "test_effect" else "sum(writes)"
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            f"SELECT tenant_id, operation_id, {column} FROM {table} GROUP BY 1, 2"
        ).fetchall()
    return Counter({(str(t), str(o)): int(n) for t, o, n in rows})


def rejected_conflicts(db_url: str) -> set[tuple[str, str]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT tenant_id, operation_id FROM rejected_delivery WHERE kind = 'conflict'"
        ).fetchall()
    return {(str(t), str(o)) for t, o in rows}


@contextmanager
def two_bridges(
    tmp_path: Path,
    emulator: PubSubEmulator,
    db_url: str,
    path: str,
    *,
    writers: tuple[int, int] = (2, 1),
    **settings: Any,
) -> Iterator[list[BridgeProcess]]:
    """Two ``fencebridge run`` processes on the subscription, with ``writers`` writer threads
    each (by default one with two writers, one with one).

    The test stops them with :func:`stop`; whatever is left running is killed on the way out.
    """
    env = bridge_env(db_url, extra={EMULATOR_HOST_ENV: emulator.host})
    with ExitStack() as stack:
        bridges = []
        for i, consumers in enumerate(writers):
            config = PubSubBridgeConfig(subscription_path=path, consumers=consumers, **settings)
            bridges.append(stack.enter_context(config.start(tmp_path, env, f"bridge-{i}")))
        for b in bridges:
            b.wait_ready()
        yield bridges


def stop(bridges: list[BridgeProcess]) -> None:
    """SIGTERM each: it drains and must exit 0."""
    for b in bridges:
        assert b.terminate() == 0, b.logs()


def assert_settled_once(
    db_url: str, stream: Backlog, effects: Counter[tuple[str, str]], state: str = "succeeded"
) -> None:
    assert work_rows(db_url) == {state: len(stream.operations)}
    assert set(effects) == stream.operations
    assert max(effects.values()) == 1, "an operation was applied twice"
    conflicts = rejected_conflicts(db_url)
    assert conflicts <= stream.conflicts
    assert conflicts, "the conflicting payloads were not recorded"


def drained(emulator: PubSubEmulator, path: str) -> list[Any]:
    return emulator.deliverable(path)


def answered(seen: Counter[str]) -> int:
    """Deliveries whose acknowledgement got an answer, or that were handed back (nacked, or
    let go to return behind an earlier message of their ordering key)."""
    return (
        seen["acked"]
        + seen["ack_id_expired"]
        + seen["ack_unanswered"]
        + seen["nacked"]
        + seen["ordering_held_back"]
    )


def wait_quiet(bridges: list[BridgeProcess], publications: int) -> Counter[str]:
    """Until every delivery received is answered, and stays so past one more ack deadline.

    A refused ack (its ack id expired) means the service hands the message out again: the
    bridges must still be running to take that copy, so quiet means nothing new arrived for
    longer than a lease of the client library (60 s with exactly-once) plus the ack deadline.
    """
    end = time.monotonic() + DRAIN_SECONDS
    quiet_since: float | None = None
    last: Counter[str] = Counter()
    while True:
        seen = total(bridges)
        assert time.monotonic() < end, f"{publications} publications, not all answered: {seen}"
        settled = seen["received"] >= publications and answered(seen) >= seen["received"]
        if not settled or seen["received"] != last["received"]:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif seen["ack_id_expired"] == 0 or time.monotonic() - quiet_since > QUIET_SECONDS:
            return seen
        last = seen
        time.sleep(0.5)


def run_down(bridges: list[BridgeProcess], db_url: str, stream: Backlog) -> Counter[str]:
    """Until every operation succeeded and every delivery was answered; then stop the bridges."""
    eventually(
        lambda: work_rows(db_url).get("succeeded", 0) == len(stream.operations),
        "every operation to succeed",
        timeout=DRAIN_SECONDS,
    )
    seen = wait_quiet(bridges, len(stream.publications))
    stop(bridges)
    return seen
