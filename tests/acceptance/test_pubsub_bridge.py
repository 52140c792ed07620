"""Pub/Sub end to end at volume: two ``fencebridge run`` processes on one exactly-once subscription.

Google's emulator (over gRPC, exactly-once delivery enforced), real PostgreSQL, real processes.
Every test pre-publishes a backlog of more than a thousand operations over three tenants with
duplicate publishes, conflicting payloads and ordering keys on part of them, and then asks what
a team would ask of a queue consumer: was every operation ingested once and applied once, is the
subscription drained (a pull after the run finds nothing), and did every acknowledgement get an
answer. The counters come from each bridge's ``/readyz`` detail; assertions never time anything.
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
    DRAIN_SECONDS,
    assert_settled_once,
    counts,
    drained,
    effects_per_operation,
    publish,
    run_down,
    stop,
    two_bridges,
    wait_quiet,
    work_rows,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]

RECORD = "record"
STEADY = "steady"
RECORD_JOB = Job("tests.support.handlers:RecordEffect", "A", lease_seconds=5.0)
STEADY_JOB = Job("tests.support.handlers:SteadyProgress", "B", lease_seconds=4.0)
OPERATIONS = 1050


@pytest.fixture(scope="module")
def emulator() -> Iterator[PubSubEmulator]:
    with pubsub_emulator(require_launcher()) as running:
        yield running


@pytest.fixture
def live_emulator(emulator: PubSubEmulator) -> PubSubEmulator:
    emulator.start()  # a test may have killed it
    return emulator


def test_an_exactly_once_backlog_drains_through_two_bridges(
    live_emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    emulator = live_emulator
    create_tables(db_url)
    topic, path = emulator.create(
        ack_deadline=10, enable_exactly_once_delivery=True, enable_message_ordering=True
    )
    stream = backlog(OPERATIONS, job_type=RECORD)
    publish(emulator, topic, stream.publications)

    with two_bridges(tmp_path, emulator, db_url, path, jobs={RECORD: RECORD_JOB}) as bridges:
        seen = run_down(bridges, db_url, stream)

    assert_settled_once(db_url, stream, effects_per_operation(db_url, "test_effect"))
    assert seen["ack_unanswered"] == 0, seen
    assert seen["acked"] >= len(stream.publications) - seen["ack_id_expired"], seen
    assert drained(emulator, path) == []


def test_after_outcome_holds_deliveries_through_handlers_that_outlive_the_ack_deadline(
    live_emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    emulator = live_emulator
    create_tables(db_url)
    # No message ordering here: the emulator applies exactly-once's in-order acknowledgement to
    # every message of an ordered subscription, keyed or not (the service only within a key),
    # so one slow handler would hold back the acks of everything delivered after it.
    topic, path = emulator.create(ack_deadline=10, enable_exactly_once_delivery=True)
    # Most handlers are quick; about one in a hundred works 70 s, reporting progress all along:
    # past its 4 s lease, the 10 s ack deadline and the 60 s the client leases a message for
    # from its receipt, so only the holder's extensions keep those deliveries from going out
    # again.
    stream = backlog(
        OPERATIONS,
        job_type=STEADY,
        payload={"work_seconds": 0},
        slow={"work_seconds": 70, "step_seconds": 0.5},
        slow_share=0.01,
        ordered=0.0,
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
        # The emulator may stream every message to one of the two subscribers: the bridge
        # that holds long-running deliveries first is the one stopped, whichever it is.
        try:
            eventually(
                lambda: any(holds_long_runs(b) for b in bridges),
                "a bridge to hold deliveries whose handlers run long",
                timeout=DRAIN_SECONDS,
            )
        except AssertionError as e:
            first, second = bridges
            raise AssertionError(
                f"{e}: first {counts(first)}, second {counts(second)}, rows {work_rows(db_url)}"
                f"\n{first.logs()[-4000:]}"
            ) from None
        holder, other = bridges if holds_long_runs(bridges[0]) else bridges[::-1]
        # SIGTERM the holder while it holds deliveries: it hands them back at once and the
        # other bridge takes them (their rows' leases lapse and are taken over).
        before = counts(holder)
        assert holder.terminate() == 0, holder.logs()
        handed_back = re.search(r"handed back (\d+) unwritten and (\d+) held", holder.logs())
        assert handed_back is not None, holder.logs()
        assert int(handed_back[2]) > 0
        eventually(
            lambda: work_rows(db_url).get("succeeded", 0) == len(stream.operations),
            "every operation to succeed",
            timeout=DRAIN_SECONDS,
        )
        # The other bridge gets what the holder had not received, and the copies it handed
        # back: a copy the service handed to the holder's closing stream meanwhile stays
        # leased by the client library (60 s with exactly-once) before it comes back.
        expected = len(stream.publications) - before["received"] + int(handed_back[2])
        seen = wait_quiet([other], expected)
        stop([other])

    assert_settled_once(db_url, stream, effects_per_operation(db_url, "test_target"))
    assert before["extended"] + seen["extended"] > 0, "no held delivery needed an extension"
    assert before["broker_lease_lost"] + seen["broker_lease_lost"] == 0
    assert seen["let_go"] == 0
    assert seen["ack_unanswered"] == 0
    assert drained(emulator, path) == []


def holds_long_runs(bridge: BridgeProcess) -> bool:
    seen = counts(bridge)
    return seen["held"] > 0 and seen["extended"] > 0


def test_an_emulator_crash_mid_run_and_a_republished_backlog_are_ingested_once(
    live_emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    emulator = live_emulator
    create_tables(db_url)
    options = {"enable_exactly_once_delivery": True, "enable_message_ordering": True}
    topic, path = emulator.create(ack_deadline=10, **options)
    name = path.rsplit("/", 1)[1]
    stream = backlog(OPERATIONS, job_type=RECORD, seed=17)
    publish(emulator, topic, stream.publications)

    with two_bridges(tmp_path, emulator, db_url, path, jobs={RECORD: RECORD_JOB}) as bridges:
        eventually(
            lambda: sum(work_rows(db_url).values()) >= len(stream.operations) // 4,
            "a quarter of the backlog to be ingested",
            timeout=DRAIN_SECONDS,
        )
        # The emulator keeps everything in memory: after the crash the topic, the subscription
        # and every unacknowledged message are gone. The producer creates them again and
        # republishes its whole backlog, as a producer without confirmations must.
        emulator.restart()
        topic, path = emulator.create(name, ack_deadline=10, **options)
        publish(emulator, topic, stream.publications)
        seen = run_down(bridges, db_url, stream)

    assert_settled_once(db_url, stream, effects_per_operation(db_url, "test_effect"))
    # Deliveries of the crashed emulator and of the republished backlog both reached the bridges.
    assert seen["received"] > len(stream.publications)
    assert drained(emulator, path) == []
