"""The class A outbox and its relay, against PostgreSQL and moto's SQS over HTTP.

A handler's messages commit with its business write or not at all; a retried run writes the
same message ids; the relay sends a backlog of more than a thousand operations through a proxy
that cuts its connections and refuses its calls, and every message arrives, by its id, with
nothing left pending; a relay whose lease was taken over has its marks refused.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge import keyring, sql
from bridge.adapters.sinks import Refusal, Refused
from bridge.config import read_destination
from bridge.database import DATABASE_URL_ENV, Connection
from bridge.demo import invoices
from bridge.errors import RelayLost
from bridge.events import EventCounter
from bridge.executors import execute
from bridge.executors.registry import Registry
from bridge.executors.settlement import Run
from bridge.handlers import Context, RetryLater, SameDatabaseHandler, Success
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.outbox.publish import MESSAGE_ID_ATTRIBUTE, OutboxError, OutboxMessage
from bridge.outbox.relay import DestinationRelay
from bridge.store import PostgresStore
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.types import Key, State
from consumers.sns import sink as sns_sink
from tests.support.deliveries import for_job
from tests.support.outbox import destination, drain, sqs_sink
from tests.support.roles import Roles, apply_roles, drop_roles
from tests.support.sqs_proxy import Fault, sqs_proxy
from tests.support.sqs_server import REGION, SqsServer, sqs_server
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]
LEASE = timedelta(seconds=30)
JOB = "refund_invoice"
DESTINATION = "refunds"


class RefundAndAnnounce(SameDatabaseHandler):
    """Refunds the invoice and announces it twice (the refund, then a receipt), in one
    transaction; raises what ``fail`` holds for an operation after publishing."""

    def __init__(self) -> None:
        self._refund = invoices.RefundInvoice()
        self.fail: dict[str, BaseException] = {}
        self.published: dict[str, list[str]] = {}

    def handle(self, ctx: Context, tx: Connection) -> Success:
        result = self._refund.handle(ctx, tx)
        body = json.dumps({"operation": ctx.operation_id, "fence": ctx.fence})
        ids = [
            ctx.outbox.publish(
                DESTINATION,
                body,
                attributes={"tenant": ctx.tenant_id, "operation": ctx.operation_id},
                ordering_key=ctx.operation_id,
            ),
            ctx.outbox.publish(DESTINATION, b"receipt", ordering_key=ctx.operation_id),
        ]
        self.published.setdefault(ctx.operation_id, []).extend(ids)
        failure = self.fail.pop(ctx.operation_id, None)
        if failure is not None:
            raise failure
        return result


class Bench:
    def __init__(self, store: PostgresStore, db: Db) -> None:
        self.store = store
        self.db = db
        self.hasher = IdentityHasher(b"outbox-tests-identity-secret")
        self.registry = Registry()
        self.handler = RefundAndAnnounce()
        self.registry.register(JOB, self.handler, outbox_destinations=frozenset({DESTINATION}))

    def add(self, operations: list[str], tenant: str = "t1") -> list[Key]:
        with self.db.transaction():
            for op in operations:
                invoices.add_invoice(self.db, tenant, f"inv-{op}", amount=100)
        self.store.inbox.ingest(
            [
                for_job(self.registry, JOB, op, {"invoice_id": f"inv-{op}"}, tenant=tenant)
                for op in operations
            ]
        )
        return [Key(tenant, op) for op in operations]

    def run(self, key: Key) -> None:
        (claim,) = self.store.claims.claim_keys("worker", [key], LEASE)
        spec = self.registry[JOB]
        ctx = Context.for_claim(claim, self.hasher)
        execute(Run(self.store.settle, claim, spec, ctx, EventCounter()))

    def state(self, key: Key) -> State:
        row = self.db.execute(
            "SELECT state FROM work_item WHERE tenant_id = %s AND operation_id = %s",
            (key.tenant_id, key.operation_id),
        ).fetchone()
        assert row is not None
        return State(row[0])

    def messages(self) -> list[tuple[str, str, int, str]]:
        rows = self.db.execute(
            "SELECT message_id, operation_id, fence, state FROM outbox_message ORDER BY seq"
        ).fetchall()
        return [(str(a), str(b), int(c), str(d)) for a, b, c, d in rows]


@pytest.fixture
def bench(store: PostgresStore, db: Db) -> Bench:
    invoices.install(db)
    return Bench(store, db)


@pytest.fixture
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def test_messages_commit_with_the_business_write_and_a_retry_writes_the_same_ids(
    bench: Bench,
) -> None:
    (key,) = bench.add(["op-1"])
    bench.handler.fail["op-1"] = RetryLater("not_yet")
    bench.run(key)
    # the run published two messages, then its transaction rolled back: none is left
    assert bench.state(key) is State.QUEUED
    assert bench.messages() == []
    first_attempt = list(bench.handler.published["op-1"])
    assert len(first_attempt) == 2

    bench.db.execute("UPDATE work_item SET next_attempt_at = now() WHERE operation_id = 'op-1'")
    bench.run(key)
    assert bench.state(key) is State.SUCCEEDED
    second_attempt = bench.handler.published["op-1"][2:]
    assert second_attempt == first_attempt, "a retry writes the same message ids"
    stored = bench.messages()
    assert [m[0] for m in stored] == first_attempt
    assert {(m[1], m[2], m[3]) for m in stored} == {("op-1", 2, "pending")}
    # the ids carry no raw identifier
    assert all("op-1" not in m[0] and "t1" not in m[0] for m in stored)


def test_ids_differ_between_operations_and_tenants_with_colliding_operation_ids(
    bench: Bench,
) -> None:
    keys = bench.add(["op-1"], tenant="acme") + bench.add(["op-1"], tenant="globex")
    for key in keys:
        bench.run(key)
    ids = [m[0] for m in bench.messages()]
    assert len(ids) == 4
    assert len(set(ids)) == 4


@pytest.mark.slow
def test_a_run_past_its_deadline_leaves_no_message(bench: Bench) -> None:
    (key,) = bench.add(["op-slow"])

    def slow() -> None:
        time.sleep(1.5)

    class Slow(RefundAndAnnounce):
        deadline = timedelta(seconds=0.5)

        def handle(self, ctx: Context, tx: Connection) -> Success:
            result = super().handle(ctx, tx)
            slow()
            return result

    bench.registry = Registry()
    bench.handler = Slow()
    bench.registry.register(JOB, bench.handler, outbox_destinations=frozenset({DESTINATION}))
    bench.run(key)
    assert bench.handler.published["op-slow"], "the handler did publish"
    assert bench.state(key) is State.QUEUED
    assert bench.messages() == []


def test_an_unknown_destination_or_a_reserved_attribute_fails_the_run_with_nothing_written(
    bench: Bench,
) -> None:
    class Wrong(SameDatabaseHandler):
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.raised: list[BaseException] = []

        def handle(self, ctx: Context, tx: Connection) -> None:
            try:
                ctx.outbox.publish(**self.kwargs)
            except OutboxError as exc:
                self.raised.append(exc)
                raise

    for op, kwargs in {
        "op-a": {"destination": "nowhere", "body": "x"},
        "op-b": {
            "destination": DESTINATION,
            "body": "x",
            "attributes": {MESSAGE_ID_ATTRIBUTE: "forged"},
        },
        "op-c": {"destination": DESTINATION, "body": b""},
    }.items():
        bench.registry = Registry()
        handler = Wrong(**kwargs)
        bench.registry.register(JOB, handler, outbox_destinations=frozenset({DESTINATION}))
        (key,) = bench.add([op])
        bench.run(key)
        assert bench.state(key) is State.FAILED_TERMINAL
        assert len(handler.raised) == 1
    assert bench.messages() == []


def test_publishing_outside_a_class_a_transaction_is_refused() -> None:
    ctx = Context(
        tenant_id="t1",
        operation_id="op-1",
        job_type=JOB,
        subscription="s",
        attempt=1,
        max_attempts=5,
        fence=1,
        payload=b"{}",
    )
    with pytest.raises(OutboxError, match="only inside a class A handler"):
        ctx.outbox.publish(DESTINATION, "x")


# -- the relay -----------------------------------------------------------------------------------


#: the backlog's destinations, one queue each: moto's SQS slows down with every message a queue
#: holds, so the backlog is spread over a few queues (and relays)
SPREAD = [f"announce-{n}" for n in range(4)]


class AnnounceOnce(SameDatabaseHandler):
    """Refunds the invoice and publishes one announcement, to the destination its number picks."""

    def __init__(self) -> None:
        self._refund = invoices.RefundInvoice()

    def handle(self, ctx: Context, tx: Connection) -> Success:
        result = self._refund.handle(ctx, tx)
        number = int(ctx.operation_id.rpartition("-")[2])
        ctx.outbox.publish(
            SPREAD[number % len(SPREAD)],
            json.dumps({"operation": ctx.operation_id, "fence": ctx.fence}),
            ordering_key=ctx.operation_id,
        )
        return result


@pytest.mark.slow
def test_a_backlog_of_1000_operations_reaches_sqs_through_cut_connections_once_by_id(
    bench: Bench, store: PostgresStore, sqs: SqsServer
) -> None:
    bench.registry = Registry()
    bench.registry.register(JOB, AnnounceOnce(), outbox_destinations=frozenset(SPREAD))
    operations = [f"op-{i:05d}" for i in range(1000)]
    # a few operations are delivered twice: a replay, never a second run or message
    keys = bench.add(operations)
    replays = bench.store.inbox.ingest(
        [for_job(bench.registry, JOB, op, {"invoice_id": f"inv-{op}"}) for op in operations[:50]]
    )
    assert {r.decision.value for r in replays} == {"replay"}
    # and a few again with another payload: conflicts, recorded, never run or announced
    conflicts = bench.store.inbox.ingest(
        [for_job(bench.registry, JOB, op, {"invoice_id": "other"}) for op in operations[50:70]]
    )
    assert {r.decision.value for r in conflicts} == {"conflict"}
    for key in keys:
        bench.run(key)
    written = {m[0] for m in bench.messages()}
    assert len(written) == 1000
    queues = {name: sqs.create_queue(name) for name in SPREAD}

    with sqs_proxy(sqs.endpoint, seed=7) as proxy:
        # one call in five fails: a 500, a throttle, or applied and then the connection cut
        proxy.set_faults(
            0.2,
            kinds=(Fault.ERROR, Fault.THROTTLE, Fault.RESET),
            actions=frozenset({"SendMessageBatch"}),
        )
        relays = [
            DestinationRelay(
                name,
                destination(url),
                store.outbox,
                sqs_sink(proxy.url, url),
                owner="relay-1",
            )
            for name, url in queues.items()
        ]
        for relay in relays:
            relay.service.start()
        try:
            eventually(
                lambda: (
                    bench.db.execute(
                        "SELECT count(*) FROM outbox_message WHERE state = 'pending'"
                    ).fetchone()
                    == (0,)
                ),
                "every message marked sent",
                timeout=200,
            )
        finally:
            for relay in relays:
                relay.service.stop(10)
        assert proxy.faults() > 0, "the fault was injected"
        assert proxy.counts["proxy_error"] == 0

    assert bench.db.execute(
        "SELECT state, count(*) FROM outbox_message GROUP BY state"
    ).fetchall() == [("sent", 1000)]
    received: list[dict[str, Any]] = []
    for name, url in queues.items():
        expected = bench.db.execute(
            "SELECT count(*) FROM outbox_message WHERE destination = %s", (name,)
        ).fetchone()
        assert expected is not None
        received.extend(drain(sqs, url, int(expected[0])))
    ids = Counter(m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in received)
    assert set(ids) == written, "every message arrived, and nothing else"
    # a connection cut after the send applied makes a copy: the same id, never a new message
    duplicates = sum(n - 1 for n in ids.values())
    assert len(received) == 1000 + duplicates
    announced = {json.loads(m["Body"])["operation"] for m in received}
    assert announced == set(operations)
    # each operation's announcement carries the fence of the run that committed it
    assert {json.loads(m["Body"])["fence"] for m in received} == {1}


def test_a_relay_taken_over_has_its_marks_refused_and_the_new_one_sends(
    bench: Bench, store: PostgresStore, sqs: SqsServer
) -> None:
    keys = bench.add(["op-1", "op-2"])
    for key in keys:
        bench.run(key)
    queue_url = sqs.create_queue("outbox")
    outbox = store.outbox
    old = outbox.take(DESTINATION, "old", timedelta(seconds=30))
    assert old == 1
    assert outbox.take(DESTINATION, "new", timedelta(seconds=30)) is None, "held by old"
    # the old relay's lease runs out (as for a paused process), and another takes over
    bench.db.execute("UPDATE outbox_relay SET lease_expires_at = now() - interval '1 second'")
    new = outbox.take(DESTINATION, "new", timedelta(seconds=30))
    assert new == 2
    pending = outbox.pending(DESTINATION, 10)
    with pytest.raises(RelayLost):
        outbox.mark(DESTINATION, old, sent=[m.message_id for m in pending], max_attempts=3)
    assert outbox.renew(DESTINATION, old, timedelta(seconds=30)) is False
    # each mark carries the fence condition itself: run alone under the old fence, none applies
    ids = [m.message_id for m in pending]
    base = {"destination": DESTINATION, "fence": old, "ids": ids}
    assert bench.db.execute(sql.statement("outbox_sent"), base).fetchall() == []
    assert bench.db.execute(sql.statement("outbox_park"), {**base, "reason": "x"}).fetchall() == []
    failed = {**base, "error": "x", "max_attempts": 1}
    assert bench.db.execute(sql.statement("outbox_failed"), failed).fetchall() == []
    assert {m[3] for m in bench.messages()} == {"pending"}

    sink = sqs_sink(sqs.endpoint, queue_url)
    refused = sink.send(pending)
    assert refused == {}
    done, parked = outbox.mark(
        DESTINATION, new, sent=[m.message_id for m in pending], max_attempts=3
    )
    assert (done, parked) == (4, 0)
    assert {m[3] for m in bench.messages()} == {"sent"}


@pytest.mark.slow
def test_a_message_the_queue_refuses_is_parked_with_the_reason_and_others_are_sent(
    bench: Bench, store: PostgresStore, sqs: SqsServer
) -> None:
    (key,) = bench.add(["op-1"])
    bench.run(key)
    bench.db.execute(
        "UPDATE outbox_message SET body = %s WHERE message_id = %s",
        (b"\xff\xfe not text", bench.messages()[0][0]),
    )
    queue_url = sqs.create_queue("outbox")
    relay = DestinationRelay(
        DESTINATION,
        destination(queue_url),
        store.outbox,
        sqs_sink(sqs.endpoint, queue_url),
        owner="relay-1",
    )
    relay.round()  # takes the lease, sends, marks
    rows = bench.db.execute("SELECT state, park_reason FROM outbox_message ORDER BY seq").fetchall()
    assert rows[0][0] == "parked"
    assert "not UTF-8" in rows[0][1]
    # the receipt is of the same ordering key, behind a parked message: it is sent (a parked
    # message no longer holds its key), in a later round
    relay.round()
    assert [
        r[0] for r in bench.db.execute("SELECT state FROM outbox_message ORDER BY seq").fetchall()
    ] == ["parked", "sent"]
    assert relay.parked_total == 1
    received = drain(sqs, queue_url, 1)
    assert [m["Body"] for m in received] == ["receipt"]


# -- status, metrics, retention --------------------------------------------------------------------


def backlog(bench: Bench, store: PostgresStore) -> list[str]:
    """Three operations' messages: op-1's sent an hour ago, op-2's parked, op-3's pending."""
    keys = bench.add(["op-1", "op-2", "op-3"])
    for key in keys:
        bench.run(key)
    outbox = store.outbox
    fence = outbox.take(DESTINATION, "r", LEASE)
    assert fence is not None
    ids = {op: [m[0] for m in bench.messages() if m[1] == op] for op in ("op-1", "op-2")}
    outbox.mark(
        DESTINATION,
        fence,
        sent=ids["op-1"],
        invalid={"InvalidParameterValue": ids["op-2"]},
        max_attempts=3,
    )
    bench.db.execute(
        "UPDATE outbox_message SET sent_at = now() - interval '1 hour',"
        "       created_at = now() - interval '2 hours' WHERE state = 'sent'"
    )
    bench.db.execute(
        "UPDATE outbox_message SET created_at = now() - interval '10 minutes'"
        " WHERE state = 'pending'"
    )
    return ids["op-1"]


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    env[IDENTITY_KEY_ENV] = "outbox-tests-identity-key-0123456789"
    done = subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_status_shows_each_destinations_backlog_and_purge_removes_only_sent_messages(
    bench: Bench, store: PostgresStore, db_url: str
) -> None:
    sent = backlog(bench, store)
    document = json.loads(cli(db_url, "status", "--json").stdout)
    ((row),) = document["outbox"]
    assert row["destination"] == DESTINATION
    assert (row["pending"], row["parked"]) == (2, 2)
    assert row["oldest_pending_seconds"] >= 600
    text = cli(db_url, "status").stdout
    assert "outbox (messages committed by class A handlers" in text
    assert "op-" not in text, "no raw identifier in the status"
    assert "t1" not in text

    assert (
        "would purge 2 sent outbox message(s)"
        in cli(db_url, "purge", "--older-than", "30m", "--dry-run", "--force").stdout
    )
    # ages this short are within every broker's redelivery window: --force says it is meant
    purged = cli(db_url, "purge", "--older-than", "2h", "--force").stdout
    assert "purged 0 sent outbox message(s)" in purged
    out = cli(db_url, "purge", "--older-than", "30m", "--batch-size", "1", "--force").stdout
    assert "purged 2 sent outbox message(s)" in out
    left = bench.db.execute("SELECT message_id, state FROM outbox_message").fetchall()
    assert sorted(state for _, state in left) == ["parked", "parked", "pending", "pending"]
    assert not {m for m, _ in left} & set(sent)


def test_the_outbox_gauges_report_every_destination_by_name(
    bench: Bench, store: PostgresStore
) -> None:
    backlog(bench, store)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    outbox = store.outbox
    try:
        Telemetry(bench.hasher, meter_provider=meters).observe(
            store.operator, interval=3600, outbox=outbox.depth, destinations=[DESTINATION, "quiet"]
        )

        def points() -> dict[str, dict[str, float]]:
            found: dict[str, dict[str, float]] = {}
            data = reader.get_metrics_data()
            for resource in data.resource_metrics if data else ():
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if not metric.name.startswith("fencebridge.outbox."):
                            continue
                        for point in metric.data.data_points:
                            label = str((point.attributes or {})[n.LABEL_DESTINATION])
                            found.setdefault(metric.name, {})[label] = float(point.value)
            return found

        eventually(lambda: n.METRIC_OUTBOX_PENDING in points(), "the outbox gauges' reading")
        found = points()
    finally:
        meters.shutdown()
    assert found[n.METRIC_OUTBOX_PENDING] == {DESTINATION: 2, "quiet": 0}
    assert found[n.METRIC_OUTBOX_PARKED] == {DESTINATION: 2, "quiet": 0}
    assert found[n.METRIC_OUTBOX_OLDEST]["quiet"] == 0
    assert found[n.METRIC_OUTBOX_OLDEST][DESTINATION] >= 600


# -- the demo's class A example ------------------------------------------------------------------


def test_the_demos_refund_announces_once_and_a_stale_claim_announces_nothing(
    store: PostgresStore, db: Db
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, "acme", "inv-1042", amount=1200)
    registry = Registry()
    registry.register(
        invoices.JOB_TYPE,
        invoices.RefundAndAnnounce(),
        outbox_destinations=frozenset({invoices.EVENTS}),
    )
    hasher = IdentityHasher(b"outbox-tests-identity-secret")
    (delivery,) = [
        for_job(registry, invoices.JOB_TYPE, "refund-1", {"invoice_id": "inv-1042"}, tenant="acme")
    ]
    store.inbox.ingest([delivery])
    key = Key("acme", "refund-1")
    (stale,) = store.claims.claim_keys("stale", [key], LEASE)
    # the stale worker pauses past its lease; another takes the row over and refunds
    db.execute("UPDATE work_item SET lease_expires_at = now() - interval '1 second'")
    (current,) = store.claims.claim_keys("current", [key], LEASE)
    assert (stale.fence, current.fence) == (1, 2)
    spec = registry[invoices.JOB_TYPE]
    execute(Run(store.settle, current, spec, Context.for_claim(current, hasher), EventCounter()))
    stale_events = EventCounter()
    execute(Run(store.settle, stale, spec, Context.for_claim(stale, hasher), stale_events))
    assert stale_events["lease_lost"] == 1

    rows = db.execute("SELECT fence, body, attributes, ordering_key FROM outbox_message").fetchall()
    assert len(rows) == 1, "the stale claim was refused at the lock: no second event"
    fence, body, attributes, ordering_key = rows[0]
    assert fence == 2
    assert json.loads(bytes(body)) == {
        "event": "refund_issued",
        "invoice_id": "inv-1042",
        "amount": 1200,
        "currency": "eur",
    }
    assert attributes == {"event": "refund_issued", "tenant_id": "acme"}
    assert ordering_key == "inv-1042"
    refunded = invoices.find_invoice(db, "acme", "inv-1042")
    assert refunded is not None
    assert refunded.refunded_fence == 2


# -- the relay's bookkeeping, behind the sink seam -------------------------------------------------


class ScriptedSink:
    """A sink that refuses what it is told to (the relay's marks are what is under test; the
    real sinks' answers are tested against moto and the emulator above)."""

    def __init__(self) -> None:
        self.refuse: dict[str, Refused | None] = {}
        self.sent: list[str] = []

    def send(self, messages: Sequence[OutboxMessage]) -> Mapping[str, Refused]:
        refused: dict[str, Refused] = {}
        for m in messages:
            refusal = self.refuse.get(m.message_id)
            if refusal is not None:
                refused[m.message_id] = refusal
        self.sent += [m.message_id for m in messages if m.message_id not in refused]
        return refused

    def close(self) -> None:
        """Nothing to close."""


def test_a_message_refused_for_now_is_counted_and_parked_after_max_attempts(
    bench: Bench, store: PostgresStore
) -> None:
    (key,) = bench.add(["op-1"])
    bench.run(key)
    first, second = (m[0] for m in bench.messages())
    sink = ScriptedSink()
    sink.refuse[first] = Refused(Refusal.RETRY, "ThrottlingException")
    sink.refuse[second] = Refused(Refusal.HELD, "an earlier message of its key")
    relay = DestinationRelay(
        DESTINATION,
        destination("https://unused.example", max_attempts=3),
        store.outbox,
        sink,
        owner="relay-1",
    )
    for _ in range(2):
        relay.round()
    rows = bench.db.execute(
        "SELECT state, attempts, last_error FROM outbox_message ORDER BY seq"
    ).fetchall()
    # refused twice: counted with its reason; the held one is untouched
    assert rows == [("pending", 2, "ThrottlingException"), ("pending", 0, None)]
    relay.round()
    state, reason = bench.db.execute(
        "SELECT state, park_reason FROM outbox_message ORDER BY seq LIMIT 1"
    ).fetchone() or ("", "")
    assert state == "parked"
    assert reason == "gave up after 3 attempts: ThrottlingException"
    sink.refuse[second] = None
    relay.round()
    assert [m[3] for m in bench.messages()] == ["parked", "sent"]
    assert sink.sent == [second]


def test_a_message_carries_the_trace_context_of_the_run_that_wrote_it(
    bench: Bench, store: PostgresStore
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(bench.hasher, tracer_provider=provider)
    (key,) = bench.add(["op-1"])
    (claim,) = bench.store.claims.claim_keys("worker", [key], LEASE)
    with telemetry.process(claim):
        execute(
            Run(
                store.settle,
                claim,
                bench.registry[JOB],
                Context.for_claim(claim, bench.hasher),
                EventCounter(),
            )
        )
    (span,) = exporter.get_finished_spans()
    context = span.get_span_context()
    assert context is not None
    flags = int(context.trace_flags)
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    stored = {r[0] for r in bench.db.execute("SELECT trace_context FROM outbox_message")}
    assert stored == {expected}
    (message, _) = store.outbox.pending(DESTINATION, 10)
    assert message.sent_attributes()["traceparent"] == expected


# -- FIFO queues and SNS topics ---------------------------------------------------------------


@pytest.mark.slow
def test_a_fifo_queue_drops_a_copy_by_message_id_and_keeps_each_keys_order(
    bench: Bench, store: PostgresStore, sqs: SqsServer
) -> None:
    keys = bench.add([f"op-{i}" for i in range(6)])
    for key in keys:
        bench.run(key)
    name = f"outbox-{uuid.uuid4().hex[:8]}.fifo"
    queue_url = sqs.client().create_queue(QueueName=name, Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    outbox = store.outbox
    pending = outbox.pending(DESTINATION, 100)
    sink = sqs_sink(sqs.endpoint, queue_url)
    assert sink.fifo
    # sent twice, as by a relay that lost its lease while sending: SQS drops the copies
    assert sink.send(pending) == {}
    assert sink.send(pending) == {}
    received = drain(sqs, queue_url, len(pending))
    ids = [m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in received]
    assert sorted(ids) == sorted(m.message_id for m in pending)
    by_key: dict[str, list[str]] = {}
    for m in received:
        by_key.setdefault(m["Attributes"]["MessageGroupId"], []).append(m["Body"])
    # each operation's key: its announcement, then its receipt
    assert set(by_key) == {f"op-{i}" for i in range(6)}
    assert all(bodies[1] == "receipt" for bodies in by_key.values())


@pytest.mark.slow
def test_an_sns_topic_receives_each_message_with_its_id_and_attributes(
    bench: Bench, store: PostgresStore, sqs: SqsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sink's client takes its credentials from the environment, as in production
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    keys = bench.add(["op-1", "op-2"])
    for key in keys:
        bench.run(key)
    sns = boto3.client(
        "sns",
        endpoint_url=sqs.endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    topic = sns.create_topic(Name=f"outbox-{uuid.uuid4().hex[:8]}")["TopicArn"]
    queue_url = sqs.create_queue("sns-copy")
    queue_arn = sqs.client().get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    sns.subscribe(
        TopicArn=topic,
        Protocol="sqs",
        Endpoint=queue_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    config = read_destination(
        DESTINATION,
        {"sink": "sns", "address": topic, "region": REGION, "endpoint_url": sqs.endpoint},
    )
    relay = DestinationRelay(
        DESTINATION,
        config,
        store.outbox,
        sns_sink.open_sink(DESTINATION, config),
        owner="relay-1",
    )
    relay.round()
    assert {m[3] for m in bench.messages()} == {"sent"}
    received = drain(sqs, queue_url, 4)
    assert sorted(
        m["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"] for m in received
    ) == sorted(m[0] for m in bench.messages())
    announced = [m for m in received if m["Body"] != "receipt"]
    assert {m["MessageAttributes"]["tenant"]["StringValue"] for m in announced} == {"t1"}


def test_erasing_a_tenant_removes_its_outbox_messages_and_no_other_tenants(
    bench: Bench, store: PostgresStore
) -> None:
    keyring.attach(store.keys, bench.hasher, used_by="test")
    for key in bench.add(["op-1", "op-2"], tenant="acme") + bench.add(["op-1"], tenant="globex"):
        bench.run(key)
    # sent (an erasure is refused while one is pending: test_erasure_outbox.py)
    bench.db.execute("UPDATE outbox_message SET state = 'sent', sent_at = now()")

    def left() -> list[tuple[str, str]]:
        rows = bench.db.execute(
            "SELECT DISTINCT tenant_id, operation_id FROM outbox_message ORDER BY 1, 2"
        ).fetchall()
        return [(str(t), str(o)) for t, o in rows]

    # one operation (a data-subject request that names one order), then the whole tenant
    one = store.operator.erase(
        "acme",
        operation_id="op-1",
        tenant_hash=bench.hasher.tenant("acme"),
        operation_hash=bench.hasher.operation("acme", "op-1"),
        actor="test",
        reason="DSR-1",
    )
    assert one.work_rows == 1
    assert left() == [("acme", "op-2"), ("globex", "op-1")]
    rest = store.operator.erase(
        "acme", tenant_hash=bench.hasher.tenant("acme"), actor="test", reason="DSR-2"
    )
    assert rest.work_rows == 1
    assert left() == [("globex", "op-1")]


# -- roles ---------------------------------------------------------------------------------------


class PublishOnly(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> None:
        ctx.outbox.publish(DESTINATION, "hello", ordering_key=ctx.operation_id)


def test_the_bridge_role_publishes_and_relays_and_a_tenant_role_reads_only_its_own(
    db_url: str, db: Db
) -> None:
    prefix = f"fbob_{secrets.token_hex(4)}"
    try:
        apply_roles(db_url, prefix)
        roles = Roles(prefix, db_url)
        bridge = PostgresStore.connect(roles.url_as(roles.bridge), max_size=2)
        try:
            registry = Registry()
            registry.register(JOB, PublishOnly(), outbox_destinations=frozenset({DESTINATION}))
            hasher = IdentityHasher(b"outbox-tests-identity-secret")
            bridge.inbox.ingest(
                [for_job(registry, JOB, "op-1", tenant=t) for t in ("acme", "globex")]
            )
            for tenant in ("acme", "globex"):
                (claim,) = bridge.claims.claim_keys("w", [Key(tenant, "op-1")], LEASE)
                ctx = Context.for_claim(claim, hasher)
                execute(Run(bridge.settle, claim, registry[JOB], ctx, EventCounter()))
            outbox = bridge.outbox
            fence = outbox.take(DESTINATION, "relay", LEASE)
            assert fence is not None
            ids = [m.message_id for m in outbox.pending(DESTINATION, 10)]
            assert outbox.mark(DESTINATION, fence, sent=ids, max_attempts=3) == (2, 0)
            assert outbox.purge(timedelta(0), 10) == 2
        finally:
            bridge.close()
        # refill for the readers: one message per tenant, pending
        db.execute(
            "INSERT INTO outbox_message (message_id, tenant_id, operation_id, fence,"
            " destination, body) VALUES ('m-a', 'acme', 'op-1', 1, %s, 'x'),"
            " ('m-g', 'globex', 'op-1', 1, %s, 'x')",
            (DESTINATION, DESTINATION),
        )
        acme = f"{prefix}_acme"
        db.execute("SET fencebridge.role_prefix = " + f"'{prefix}'")
        db.execute("SELECT fencebridge_add_tenant_role(%s, %s)", (acme, "acme"))
        with roles.connect_as(acme) as conn:
            assert conn.execute("SELECT message_id FROM outbox_message").fetchall() == [("m-a",)]
        with roles.connect_as(roles.operator) as conn:
            assert len(conn.execute("SELECT 1 FROM outbox_message").fetchall()) == 2
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DELETE FROM outbox_message")
    finally:
        db.execute("RESET fencebridge.role_prefix")
        drop_roles(db_url, prefix)


@pytest.mark.slow
def test_inspect_lists_an_operations_messages_without_their_bodies(
    bench: Bench, store: PostgresStore, db_url: str
) -> None:
    backlog(bench, store)
    text = cli(db_url, "inspect", "t1", "op-2").stdout
    assert "outbox messages: 2" in text
    assert "parked" in text
    assert "InvalidParameterValue" in text
    assert "receipt" not in text, "no message body"
    document = json.loads(cli(db_url, "inspect", "t1", "op-3", "--json").stdout)
    states = [(m["destination"], m["state"], m["fence"]) for m in document["outbox"]]
    assert states == [(DESTINATION, "pending", 1)] * 2
    assert [m["message_id"] for m in document["outbox"]] == [
        m[0] for m in bench.messages() if m[1] == "op-3"
    ]
