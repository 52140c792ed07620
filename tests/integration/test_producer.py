"""Producer messages sent over HTTP to moto's SQS, received by the real consumer into PostgreSQL.

The producer builds with the example configuration's ``refunds`` rules and sends with boto3
under its own producer span; the SQS consumer receives, the inbox decodes and writes the rows,
and the telemetry of the bridge (in-memory exporter) shows the receive span and the process
span of each claimed row linked back to the producer's span. A resend of the same operation,
built again from a payload whose keys come in another order, is a replay, not a conflict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from bridge.config import load_config
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.producer import Producer
from bridge.store import PostgresStore
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.types import Key
from consumers.sqs.source import SqsConsumer
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "bridge.toml"
HASHER = IdentityHasher(b"producer-tests-identity-secret-01")
REFUND = {"amount": 1200, "currency": "eur", "reason": "damaged"}


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.mark.slow
def test_produced_messages_become_rows_whose_spans_link_to_the_producer(
    moto: SqsServer, store: PostgresStore, db_url: str
) -> None:
    config = load_config(EXAMPLE)
    producer = Producer.for_subscription(config, "refunds")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(HASHER, tracer_provider=provider)
    client = moto.client()
    queue_url = moto.create_queue("producer", VisibilityTimeout="30")

    operations = [("acme", "refund-1"), ("globex", "refund-1"), ("acme", "refund-2")]
    with provider.get_tracer("shop").start_as_current_span(
        "refunds publish", kind=SpanKind.PRODUCER
    ) as publish:
        for tenant, operation in operations:
            message = producer.sqs(
                tenant_id=tenant,
                operation_id=operation,
                job_type="refund",
                schema_version="2",
                payload=REFUND,
            )
            client.send_message(QueueUrl=queue_url, **message.request())
        resend = producer.sqs(
            tenant_id="acme",
            operation_id="refund-1",
            job_type="refund",
            schema_version="2",
            payload=dict(reversed(REFUND.items())),
        )
        client.send_message(QueueUrl=queue_url, **resend.request())
    producer_span = (publish.get_span_context().trace_id, publish.get_span_context().span_id)

    inbox = Inbox(
        store.inbox,
        partial(decode, config.decode_rules("refunds")),
        system=n.SYSTEM_SQS,
        telemetry=telemetry,
    )
    consumer = SqsConsumer(client, queue_url, "refunds", inbox, wait_seconds=1)
    consumer.start()
    try:
        eventually(lambda: consumer.counts.get("deleted", 0) == 4, "all four deliveries deleted")
    finally:
        consumer.stop(10)
    counts = consumer.counts
    assert counts.get("decision.new") == 3
    assert counts.get("decision.replay") == 1  # the resend: same bytes, same operation
    assert "decision.conflict" not in counts
    assert "decision.quarantined" not in counts

    traceparent = (
        f"00-{producer_span[0]:032x}-{producer_span[1]:016x}-"
        f"{int(publish.get_span_context().trace_flags):02x}"
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tenant_id, operation_id, job_type, schema_version, trace_context"
            " FROM work_item ORDER BY tenant_id, operation_id"
        ).fetchall()
    assert rows == [
        ("acme", "refund-1", "refund", "2", traceparent),
        ("acme", "refund-2", "refund", "2", traceparent),
        ("globex", "refund-1", "refund", "2", traceparent),
    ]
    history = store.operator.history(Key("acme", "refund-1"))
    assert history.row is not None
    assert history.row.payload_bytes == len(json.dumps(REFUND, separators=(",", ":")))

    claims = store.claims.claim_keys("w", [Key(t, o) for t, o in operations], timedelta(seconds=30))
    assert len(claims) == 3
    for claim in claims:
        with telemetry.process(claim):
            pass
    spans = exporter.get_finished_spans()
    receives = [s for s in spans if s.name == n.SPAN_RECEIVE.format(subscription="refunds")]
    processes = [s for s in spans if s.name == n.SPAN_PROCESS.format(subscription="refunds")]
    assert receives
    assert len(processes) == 3
    for span in [*receives, *processes]:
        assert {(k.context.trace_id, k.context.span_id) for k in span.links} == {producer_span}
