"""What every broker adapter must do, written once and run against each adapter.

A test module subclasses :class:`ConsumerConformance` and provides a ``broker`` fixture: a
:class:`Broker` for a fresh queue or subscription on a real local broker (moto's SQS server over
HTTP, Google's Pub/Sub emulator over gRPC). The cases speak only of what the contract says:

* nothing is acknowledged before its inbox transaction has committed; a batch whose
  transaction fails comes back and is then ingested exactly once, and the loop that failed is
  a supervised service that reports it (restarted, not ready, still live) and recovers;
* the same delivery twice is one operation (a replay);
* the same key with another payload is a recorded conflict that changes nothing, and both
  deliveries are acknowledged;
* an undecodable delivery is quarantined with its reason and acknowledged, and the consumer
  keeps receiving;
* in volume, with duplicates, conflicts and malformed messages mixed in, every message is
  accounted for and nothing is left on the broker.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import psycopg
import pytest

from bridge.ingest.decode import DecodeRules, FieldSource, JobRule, PayloadSource, decode
from bridge.ingest.inbox import Inbox
from bridge.service import Service
from bridge.store import PostgresStore
from bridge.types import TargetClass, payload_digest
from tests.support.waiting import eventually

Db = psycopg.Connection[tuple[Any, ...]]

SUBSCRIPTION = "orders"
VOLUME_WAIT_SECONDS = 300.0

RULES = DecodeRules(
    subscription=SUBSCRIPTION,
    tenant_id=FieldSource.parse("attribute:tenant"),
    operation_id=FieldSource.parse("body:/operation"),
    job_type=FieldSource.parse("value:refund"),
    jobs={"refund": JobRule(TargetClass.C, 5)},
    max_body_bytes=64 * 1024,
    payload=PayloadSource.parse("body:/amount"),
)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message as a producer sends it."""

    body: bytes
    attributes: dict[str, str] = field(default_factory=dict)


def order(tenant: str, operation: str, amount: int) -> Outgoing:
    body = json.dumps({"operation": operation, "amount": amount}).encode()
    return Outgoing(body, {"tenant": tenant})


def malformed(n: int) -> Outgoing:
    return Outgoing(b"not json " + str(n).encode(), {"tenant": "t-malformed"})


def amount_hash(amount: int) -> bytes:
    """The stored payload hash of an order (the canonical JSON of its amount)."""
    return payload_digest(json.dumps(amount).encode())


class RunningConsumer(Protocol):
    """What the suite needs of an adapter once it runs."""

    counts: Counter[str]

    def stop(self, deadline: float = 30.0) -> None: ...

    def status(self) -> tuple[bool, str]: ...

    def services(self) -> Sequence[Service]: ...


class Broker(Protocol):
    """One fresh queue or subscription on a real local broker."""

    #: the adapter's counter of confirmed acknowledgements
    ack_counter: str

    def publish(self, messages: Sequence[Outgoing]) -> list[str]:
        """Send; returns the broker's message ids, in order."""
        ...

    def consumer(self, inbox: Inbox) -> RunningConsumer:
        """A started consumer for this queue or subscription (stopped at teardown)."""
        ...

    def deliverable(self) -> int:
        """Messages not acknowledged yet, in flight or not. Only with no consumer running."""
        ...


def publish_in_waves(
    broker: Broker, consumer: RunningConsumer, messages: Sequence[Outgoing], wave: int = 100
) -> list[str]:
    """Publish a backlog of at most ``wave`` messages at a time.

    moto scans the whole queue on every call, so a queue of a thousand makes each receive
    slow; a bounded backlog keeps the test about the consumer rather than the fake.
    """
    ids: list[str] = []
    for start in range(0, len(messages), wave):
        ids += broker.publish(messages[start : start + wave])
        eventually(
            partial(_received_at_least, consumer, len(ids)),
            f"the consumer to receive {len(ids)} messages",
            VOLUME_WAIT_SECONDS,
        )
    return ids


def _received_at_least(consumer: RunningConsumer, n: int) -> bool:
    return consumer.counts["received"] >= n


def assert_nothing_left(broker: Broker, consumer: RunningConsumer) -> None:
    left = broker.deliverable()
    assert left == 0, f"{left} message(s) still on the broker; consumer counts {consumer.counts}"


def count(db: Db, query: str, *params: object) -> int:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def rows(db: Db) -> int:
    return count(db, "SELECT count(*) FROM work_item")


def rejected(db: Db, kind: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT broker_message_id, tenant_id, operation_id, reason FROM rejected_delivery"
        " WHERE kind = %s ORDER BY id",
        (kind,),
    ).fetchall()


def inbox_for(store: PostgresStore) -> Inbox:
    return Inbox(store.inbox, partial(decode, RULES))


class ConsumerConformance:
    """The cases; subclasses provide the ``broker`` fixture (``impatient_store``: conftest)."""

    def test_a_batch_is_acked_only_after_its_transaction_commits(
        self, broker: Broker, impatient_store: PostgresStore, db_url: str, db: Db
    ) -> None:
        published = broker.publish([order("t1", f"op-{i}", 100 + i) for i in range(3)])
        with psycopg.connect(db_url) as locker:
            # The test holds the table: every inbox transaction times out waiting for it.
            locker.execute("LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE")
            consumer = broker.consumer(inbox_for(impatient_store))
            eventually(
                lambda: "ingest" in consumer.status()[1],
                "an inbox write to fail and the consumer to say so",
            )
            assert not consumer.status()[0]
            assert consumer.counts[broker.ack_counter] == 0
            # The failing loop is a supervised service: restarted, not ready, and still live
            # (a database that does not answer is no reason to restart the process).
            failing = [s.status() for s in consumer.services() if not s.status().ready]
            assert failing, "the loop that failed reports it"
            assert all(f.live and f.restarts >= 1 for f in failing), failing
            assert all("StoreUnavailable" in f.reason for f in failing), failing
            locker.rollback()  # the lock goes; the messages come back and are written

        eventually(lambda: consumer.counts[broker.ack_counter] >= 3, "the batch to be acked")
        eventually(lambda: consumer.status()[0], "the consumer to be ready again")
        assert all(s.status().ready for s in consumer.services())
        consumer.stop()
        assert consumer.counts["decision.new"] == 3
        stored = db.execute("SELECT broker_message_id FROM work_item").fetchall()
        assert sorted(r[0] for r in stored) == sorted(published)
        assert_nothing_left(broker, consumer)

    def test_the_same_delivery_twice_is_one_operation(
        self, broker: Broker, store: PostgresStore, db: Db
    ) -> None:
        consumer = broker.consumer(inbox_for(store))
        broker.publish([order("t1", "op-1", 5)])
        eventually(lambda: consumer.counts[broker.ack_counter] >= 1, "the first ack")
        broker.publish([order("t1", "op-1", 5)])
        eventually(lambda: consumer.counts[broker.ack_counter] >= 2, "the second ack")
        consumer.stop()
        assert consumer.counts["decision.new"] == 1
        assert consumer.counts["decision.replay"] >= 1
        assert db.execute("SELECT tenant_id, operation_id, state FROM work_item").fetchall() == [
            ("t1", "op-1", "queued")
        ]
        assert count(db, "SELECT count(*) FROM rejected_delivery") == 0
        assert_nothing_left(broker, consumer)

    def test_another_payload_for_the_same_key_is_a_recorded_conflict(
        self, broker: Broker, store: PostgresStore, db: Db
    ) -> None:
        consumer = broker.consumer(inbox_for(store))
        (first,) = broker.publish([order("t1", "op-1", 5)])
        eventually(lambda: rows(db) == 1, "the original to be stored")
        before = db.execute("SELECT * FROM work_item").fetchall()
        (second,) = broker.publish([order("t1", "op-1", 6)])
        eventually(lambda: bool(rejected(db, "conflict")), "the conflict to be recorded")
        eventually(lambda: consumer.counts[broker.ack_counter] >= 2, "both to be acked")
        consumer.stop()
        assert db.execute("SELECT * FROM work_item").fetchall() == before
        stored = db.execute("SELECT broker_message_id, payload_hash FROM work_item").fetchone()
        assert stored == (first, amount_hash(5))
        conflicts = rejected(db, "conflict")
        assert {c[:3] for c in conflicts} == {(second, "t1", "op-1")}
        assert consumer.counts["decision.conflict"] >= 1
        assert_nothing_left(broker, consumer)

    def test_a_malformed_delivery_is_quarantined_and_the_consumer_carries_on(
        self, broker: Broker, store: PostgresStore, db: Db
    ) -> None:
        consumer = broker.consumer(inbox_for(store))
        (bad,) = broker.publish([malformed(1)])
        eventually(lambda: bool(rejected(db, "quarantined")), "the quarantine record")
        broker.publish([order("t1", "op-after", 7)])
        eventually(lambda: rows(db) == 1, "the next delivery to be stored")
        eventually(lambda: consumer.counts[broker.ack_counter] >= 2, "both to be acked")
        ready, _ = consumer.status()
        assert ready
        consumer.stop()
        ((message_id, tenant, operation, reason),) = {tuple(r) for r in rejected(db, "quarantined")}
        assert (message_id, tenant, operation) == (bad, "t-malformed", None)
        assert reason.startswith("body_not_json:")
        body = db.execute(
            "SELECT p.body FROM rejected_delivery r JOIN payload p USING (payload_ref)"
        ).fetchone()
        assert body == (malformed(1).body,)
        assert_nothing_left(broker, consumer)

    @pytest.mark.slow
    def test_a_thousand_messages_are_all_accounted_for(
        self, broker: Broker, store: PostgresStore, db: Db
    ) -> None:
        rng = random.Random(20_240_601)
        unique = [order(f"t{i % 7}", f"op-{i}", i) for i in range(930)]
        duplicates = [unique[i] for i in rng.sample(range(len(unique)), 50)]
        broken = [malformed(i) for i in range(10)]
        conflicts = [
            order(f"t{i % 7}", f"op-{i}", i + 1_000_000) for i in rng.sample(range(930), 10)
        ]
        first_wave = unique + duplicates + broken
        rng.shuffle(first_wave)

        consumer = broker.consumer(inbox_for(store))
        ids = publish_in_waves(broker, consumer, first_wave)
        by_body = dict(zip(ids, first_wave, strict=True))
        eventually(
            lambda: rows(db) == 930 and len(rejected(db, "quarantined")) >= 10,
            "the first wave to be stored",
            VOLUME_WAIT_SECONDS,
        )
        # Conflicts go second: which of two payloads is the original must not be a race.
        conflict_ids = broker.publish(conflicts)
        eventually(
            lambda: {r[0] for r in rejected(db, "conflict")} >= set(conflict_ids),
            "the conflicts to be recorded",
            VOLUME_WAIT_SECONDS,
        )
        eventually(
            lambda: consumer.counts[broker.ack_counter] >= 1000,
            "every message to be acked",
            VOLUME_WAIT_SECONDS,
        )
        consumer.stop()

        # Every valid operation once, with the payload it was first sent with.
        stored = {
            (t, o): bytes(h)
            for t, o, h in db.execute("SELECT tenant_id, operation_id, payload_hash FROM work_item")
        }
        expected = {
            (m.attributes["tenant"], json.loads(m.body)["operation"]): amount_hash(
                json.loads(m.body)["amount"]
            )
            for m in unique
        }
        assert stored == expected
        assert consumer.counts["decision.new"] == 930
        # Each malformed and each conflicting message is on record under its own message id.
        malformed_ids = {i for i, m in by_body.items() if m in broken}
        assert {r[0] for r in rejected(db, "quarantined")} == malformed_ids
        assert {r[0] for r in rejected(db, "conflict")} == set(conflict_ids)
        assert consumer.counts["received"] >= 1000
        assert consumer.counts["decision.replay"] >= 50
        assert_nothing_left(broker, consumer)
