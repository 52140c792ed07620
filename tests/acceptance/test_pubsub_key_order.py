"""Pub/Sub ordering keys at volume: two ``fencebridge run`` processes of four writers each on one
ordered subscription of the emulator, with inbox writes failing on part of the keyed messages.

The client library hands a subscriber a key's messages one at a time, the next once the one
before it was let go; the bridge lets one go once its inbox transaction committed, so a key's
rows are written, and claimed, in delivery order. A message whose write fails is nacked, and
the library hands over the key's next message at once: that one must not be written (and run)
before the failed one comes back. The order the handlers ran in is read from ``test_effect``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.bridge_process import Job
from tests.support.handlers import create_tables
from tests.support.pubsub_bridge import Backlog, backlog
from tests.support.pubsub_emulator import PubSubEmulator, pubsub_emulator, require_launcher
from tests.support.pubsub_run import (
    assert_settled_once,
    effects_per_operation,
    publish,
    run_down,
    two_bridges,
)

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]

OPERATIONS = 1050
#: writer threads of each bridge: one bridge of four. With two, the emulator's own redelivery
#: order breaks the keys' order (see docs/operations.md, the fault matrix)
WRITERS = (4,)


@pytest.fixture(scope="module")
def emulator() -> Iterator[PubSubEmulator]:
    with pubsub_emulator(require_launcher()) as running:
        yield running


@pytest.fixture
def live_emulator(emulator: PubSubEmulator) -> PubSubEmulator:
    emulator.start()
    return emulator


RECORD = "record"
RECORD_JOB = Job("tests.support.handlers:RecordEffect", "A", lease_seconds=5.0)
#: the first insert of each operation listed in ``test_ingest_fault`` fails, whichever
#: transaction makes it: a sequence per operation counts the tries (a sequence is not rolled
#: back with the failed transaction)
INGEST_FAULT = """
CREATE TABLE test_ingest_fault (
    tenant_id text NOT NULL, operation_id text NOT NULL, tries regclass NOT NULL,
    PRIMARY KEY (tenant_id, operation_id)
);
CREATE FUNCTION test_ingest_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tries regclass;
BEGIN
    SELECT f.tries INTO tries FROM test_ingest_fault f
     WHERE f.tenant_id = NEW.tenant_id AND f.operation_id = NEW.operation_id;
    IF tries IS NOT NULL AND nextval(tries) = 1 THEN
        RAISE EXCEPTION 'injected ingest fault';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_ingest_fault BEFORE INSERT ON work_item
    FOR EACH ROW EXECUTE FUNCTION test_ingest_fault();
GRANT SELECT ON test_ingest_fault TO PUBLIC;
"""


def fail_first_inserts(db_url: str, operations: list[tuple[str, str]]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(INGEST_FAULT)
        for n, (tenant, op) in enumerate(operations):
            conn.execute(f"CREATE SEQUENCE test_ingest_fault_{n}")
            conn.execute(f"GRANT USAGE ON SEQUENCE test_ingest_fault_{n} TO PUBLIC")
            conn.execute(
                "INSERT INTO test_ingest_fault VALUES (%s, %s, %s)",
                (tenant, op, f"test_ingest_fault_{n}"),
            )


def key_order(stream: Backlog) -> dict[str, list[tuple[str, str]]]:
    """Each ordering key's operations in the order they were published."""
    order: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for p in stream.publications:
        op = (p.attributes["tenant_id"], p.attributes["operation_id"])
        if p.ordering_key and op not in order[p.ordering_key]:
            order[p.ordering_key].append(op)
    return order


def run_order(db_url: str) -> list[tuple[str, str]]:
    """The operations in the order their handlers wrote their effects."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT tenant_id, operation_id FROM test_effect ORDER BY seq")
        return [(str(t), str(o)) for t, o in rows]


def test_each_ordering_key_runs_in_publish_order_through_several_writers(
    live_emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    """A message whose write failed goes back; the later messages of its key must not be
    written (and run) before it returns."""
    emulator = live_emulator
    create_tables(db_url)
    topic, path = emulator.create(ack_deadline=10, enable_message_ordering=True)
    stream = backlog(OPERATIONS, job_type=RECORD, ordered=0.6, seed=29)
    expected = key_order(stream)
    keyed = [op for ops in expected.values() for op in ops[1:]]
    faulty = random.Random(29).sample(keyed, len(keyed) * 3 // 100)
    fail_first_inserts(db_url, faulty)
    publish(emulator, topic, stream.publications)

    with two_bridges(
        tmp_path, emulator, db_url, path, writers=WRITERS, jobs={RECORD: RECORD_JOB}
    ) as bridges:
        seen = run_down(bridges, db_url, stream)

    assert_settled_once(db_url, stream, effects_per_operation(db_url, "test_effect"))
    ran = run_order(db_url)
    late = {
        key: [op for op in ran if op in set(ops)]
        for key, ops in expected.items()
        if [op for op in ran if op in set(ops)] != ops
    }
    report = f"{len(late)} of {len(expected)} keys ran out of order; counters {seen}"
    print(report)  # the numbers of a passing run, shown with -rA
    assert seen["write_failed"] > 0, report
    assert not late, report
