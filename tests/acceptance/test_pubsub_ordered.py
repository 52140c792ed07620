"""Pub/Sub ordering keys at volume: two ``fencebridge run`` processes on one ordered,
exactly-once subscription of the emulator.

With message ordering and exactly-once delivery the service confirms the ack of a copy only once
the copies delivered before it of its ordering key are acknowledged, and answers an early one
with ``TRANSIENT_FAILURE_UNORDERED_ACK_ID``. The emulator enforces this too: per ordering key
across every stream of the subscription, and it counts the unkeyed messages of an ordered
subscription as one more key (the service does not order them). A copy whose lease lapses is
handed out again with every later copy of its key, so one lapse turns a key's tail into replays.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.bridge_process import BridgeProcess, Job
from tests.support.handlers import create_tables
from tests.support.pubsub_bridge import backlog
from tests.support.pubsub_emulator import PubSubEmulator, pubsub_emulator, require_launcher
from tests.support.pubsub_run import (
    assert_settled_once,
    effects_per_operation,
    publish,
    run_down,
    two_bridges,
)

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]

STEADY = "steady"
STEADY_JOB = Job("tests.support.handlers:SteadyProgress", "B", lease_seconds=4.0)
OPERATIONS = 1050
_UNORDERED = re.compile(r"ack or deadline call not confirmed: .*UNORDERED_ACK_ID")


@pytest.fixture(scope="module")
def emulator() -> Iterator[PubSubEmulator]:
    with pubsub_emulator(require_launcher()) as running:
        yield running


@pytest.fixture
def live_emulator(emulator: PubSubEmulator) -> PubSubEmulator:
    emulator.start()
    return emulator


def refused_calls(bridges: list[BridgeProcess]) -> int:
    """Ack calls the service answered with an unordered-ack refusal, from the bridges' logs."""
    return sum(len(_UNORDERED.findall(b.logs())) for b in bridges)


def test_after_outcome_on_an_ordered_subscription_acks_each_key_in_delivery_order(
    live_emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    emulator = live_emulator
    create_tables(db_url)
    topic, path = emulator.create(
        ack_deadline=10, enable_exactly_once_delivery=True, enable_message_ordering=True
    )
    # Three in a hundred handlers work 20 s, reporting progress all along: past their 4 s
    # lease and the 10 s ack deadline. Later copies of their ordering keys (and, on the
    # emulator, the unkeyed copies delivered after them) wait for them to be acknowledged.
    stream = backlog(
        OPERATIONS,
        job_type=STEADY,
        payload={"work_seconds": 0},
        slow={"work_seconds": 20, "step_seconds": 0.5},
        slow_share=0.03,
        seed=23,
    )
    publish(emulator, topic, stream.publications)

    with two_bridges(
        tmp_path,
        emulator,
        db_url,
        path,
        jobs={STEADY: STEADY_JOB},
        ack_mode="after_outcome",
        worker_threads=16,
    ) as bridges:
        seen = run_down(bridges, db_url, stream)
        refused = refused_calls(bridges)

    assert_settled_once(db_url, stream, effects_per_operation(db_url, "test_target"))
    excess = seen["received"] - len(stream.publications)
    report = f"excess deliveries {excess}, unordered-ack refusals {refused}, counters {seen}"
    print(report)  # the numbers of a passing run, shown with -rA
    # Every delivery arrived once: no copy lapsed, so no key's tail was handed out again.
    assert excess <= len(stream.publications) // 100, report
    assert seen["ack_id_expired"] == 0, report
    assert seen["broker_lease_lost"] == 0, report
    assert seen["let_go"] == 0, report
    assert seen["ack_unanswered"] == 0, report
    # A keyed copy's ack is never sent before those of its key delivered earlier.
    assert seen["ack_unordered_keyed"] == 0, report
