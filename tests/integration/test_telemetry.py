"""Spans, metrics and decision events of real runs, read back with the SDK's in-memory exporters.

One run of the whole bridge (moto's SQS over HTTP, a real PostgreSQL, the runtime's own wiring)
is driven through every path an operator watches: a batch holding a new delivery, a replay, a
conflict and an undecodable message; a class C charge whose first answer is lost (reconcile,
then retry); two class B writes whose first attempt stalls past its lease (one learns it lost
the lease, the other writes late and is fenced out by the target); a class D call with an
ambiguous result (parked unknown); a handler quarantine; and a message that carries only an
X-Ray ``AWSTraceHeader``. The test publishes under its own producer span, so every consumer span
can be checked for the link back to it. The module's tests then assert what that run emitted.

Pub/Sub propagation runs against Google's emulator (skipped where it is not installed, failed
under CI). The exporters wired from the environment are checked in subprocesses, because
``configure_telemetry`` sets the process-wide providers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    InMemoryMetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge.config import parse_config
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import (
    Applied,
    ConditionalWriteHandler,
    Context,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    RateLimited,
    Success,
    UnfencedHandler,
)
from bridge.identity import IdentityHasher
from bridge.ingest.decode import DecodeRules, FieldSource, JobRule, PayloadSource, decode
from bridge.ingest.inbox import Inbox
from bridge.runtime.process import Bridge, build_registry
from bridge.store import PostgresStore
from bridge.store.work import ConcurrencyLimit, Settlement
from bridge.targets.postgres import fenced_write
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.telemetry.recorder import DURATION_BUCKETS_SECONDS
from bridge.types import Delivery, Key, RawDelivery, State, TargetClass
from tests.support.deliveries import for_job
from tests.support.handlers import TARGET_WRITE, RecordEffect, create_tables, instructions
from tests.support.policy import with_policy
from tests.support.postgres import database_from
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "telemetry.md"
SECRET = b"telemetry-tests-identity-secret-01"
TENANT = "t-telemetry"
SUBSCRIPTION = "orders"
#: how long a stalled attempt waits for the takeover before giving up (a failing run)
STALL_LIMIT = 60.0
#: an X-Ray header as SQS sets it for a traced producer, and the W3C ids it converts to
XRAY_TRACE_ID = "5759e988bd862e3fe1be46a994272793"
XRAY_PARENT = "53995c3f42cd8ad8"
XRAY_HEADER = f"Root=1-5759e988-bd862e3fe1be46a994272793;Parent={XRAY_PARENT};Sampled=1"
#: a lease that lapses almost at once, for a claim nobody renews
LAPSED_LEASE = timedelta(milliseconds=50)


# -- providers ---------------------------------------------------------------------------------


@dataclass
class Tracing:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture(scope="session")
def tracing() -> Tracing:
    """The process's global SDK tracer provider, exporting to memory.

    The executors' reconcile span (and the Pub/Sub client's own spans) use the global provider,
    which can be set only once per process: install it here, or join one already installed.
    """
    exporter = InMemorySpanExporter()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current
    else:
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another global tracer provider won"
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, exporter)


@pytest.fixture
def spans(tracing: Tracing) -> Iterator[Tracing]:
    """The tracer, with the spans of earlier tests cleared."""
    tracing.exporter.clear()
    yield tracing
    tracing.exporter.clear()


def metric_points(data: MetricsData | None) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Every data point by metric name, with its attributes."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = defaultdict(list)
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[metric.name].append((dict(point.attributes or {}), point))
    return found


@dataclass(frozen=True)
class Instrument:
    kind: str
    unit: str
    labels: tuple[str, ...]
    description: str


def instruments(data: MetricsData | None) -> dict[str, Instrument]:
    """What each emitted metric is: kind, unit, the label keys seen and its description."""
    kinds = {Sum: "counter", Histogram: "histogram", Gauge: "gauge"}
    found: dict[str, Instrument] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                labels = sorted({k for p in metric.data.data_points for k in p.attributes or {}})
                found[metric.name] = Instrument(
                    kinds[type(metric.data)],
                    metric.unit or "",
                    tuple(labels),
                    metric.description or "",
                )
    return found


def total(points: list[tuple[dict[str, Any], Any]], **labels: str) -> float:
    """The sum of the points whose attributes include ``labels``."""
    return sum(p.value for attrs, p in points if all(attrs.get(k) == v for k, v in labels.items()))


def by_label(points: list[tuple[dict[str, Any], Any]], label: str) -> dict[str, float]:
    out: Counter[str] = Counter()
    for attrs, p in points:
        out[str(attrs.get(label))] += p.value
    return dict(out)


def linked(span: ReadableSpan) -> set[tuple[int, int]]:
    return {(link.context.trace_id, link.context.span_id) for link in span.links}


def ids(context: SpanContext) -> tuple[int, int]:
    return (context.trace_id, context.span_id)


# -- handlers the run drives ---------------------------------------------------------------------


class Signals:
    """Per-operation events shared by the attempts of one operation (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = defaultdict(threading.Event)

    def __getitem__(self, operation_id: str) -> threading.Event:
        with self._lock:
            return self._events[operation_id]


class StallingWrite(ConditionalWriteHandler):
    """Class B: a fenced write of ``test_target``; a payload may make attempt 1 stall.

    ``{"stall": "progress"}``: attempt 1 stops reporting progress, waits until the takeover has
    written and its own lease is known lost, then reports progress, which raises LeaseLost.
    ``{"stall": "write"}``: attempt 1 waits until the takeover has written, then writes with
    its old fence, which the target refuses (fenced out).
    """

    def __init__(self, target_url: str) -> None:
        self._url = target_url
        self.written = Signals()

    def handle(self, ctx: Context) -> Success:
        stall = instructions(ctx).get("stall")
        if stall and ctx.attempt == 1:
            assert self.written[ctx.operation_id].wait(STALL_LIMIT), "no takeover wrote"
            if stall == "progress":
                assert ctx.lease_lost.wait(STALL_LIMIT), "the lease was never declared lost"
                ctx.progress()  # raises LeaseLost
        with psycopg.connect(self._url, autocommit=True) as conn:
            fenced_write(
                conn,
                TARGET_WRITE,
                {"tenant_id": ctx.tenant_id, "operation_id": ctx.operation_id},
                ctx,
            )
        self.written[ctx.operation_id].set()
        return Success("written")


class FlakyCharge(IdempotentApiHandler):
    """Class C: the first attempt's request gets no answer and was not applied."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.applied: set[str] = set()

    def perform(self, ctx: Context, key: str) -> Success:
        if ctx.attempt == 1:
            raise TimeoutError("the provider did not answer")
        with self._lock:
            self.applied.add(key)
        return Success("charged")

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        with self._lock:
            return Applied("charged") if key in self.applied else NotApplied()


class Notify(UnfencedHandler):
    """Class D: every call times out (ambiguous); ``{"mode": "unreadable"}`` is quarantined."""

    def validate(self, ctx: Context) -> None:
        if instructions(ctx).get("mode") == "unreadable":
            raise Quarantine("unreadable", "the payload names no recipient")

    def call(self, ctx: Context) -> Success:
        raise TimeoutError("no answer")


CONFIG = """
[bridge]
worker_id = "telemetry-test"
worker_threads = 6
poll_interval_seconds = 0.1
sweep_interval_seconds = 1.0
shutdown_deadline_seconds = 10.0
health_port = 0

[jobs.record]
handler = "tests.support.handlers:RecordEffect"
target_class = "A"
max_attempts = 3
lease_seconds = 10
backoff_initial_seconds = 0.1
backoff_max_seconds = 0.2

[jobs.write]
handler = "tests.integration.test_telemetry:StallingWrite"
target_class = "B"
max_attempts = 3
lease_seconds = 1
backoff_initial_seconds = 0.1
backoff_max_seconds = 0.2

[jobs.charge]
handler = "tests.integration.test_telemetry:FlakyCharge"
target_class = "C"
max_attempts = 3
lease_seconds = 10
backoff_initial_seconds = 0.1
backoff_max_seconds = 0.2

[jobs.notify]
handler = "tests.integration.test_telemetry:Notify"
target_class = "D"
lease_seconds = 10

[subscriptions.{subscription}]
source = "sqs"
queue_url = "{queue_url}"
region = "us-east-1"
endpoint_url = "{endpoint}"
wait_seconds = 1
job_types = ["record", "write", "charge", "notify"]

[subscriptions.{subscription}.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "attribute:job_type"
payload = "body"
"""


# -- the SQS run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    operation_id: str | None
    job_type: str
    body: dict[str, Any]
    tenant_id: str | None = TENANT
    xray_only: bool = False


#: one batch (SQS hands out at most ten): every inbox decision and every executor path
BATCH = (
    Sent("op-a", "record", {"n": 1}),
    Sent("op-a", "record", {"n": 1}),  # the same delivery again: replay
    Sent("op-a", "record", {"n": 2}),  # the same operation, another payload: conflict
    Sent("op-x", "record", {"n": 1}, tenant_id=None),  # no tenant: quarantined
    Sent("op-charge", "charge", {"amount": 5}),
    Sent("op-lost", "write", {"stall": "progress"}),
    Sent("op-fenced", "write", {"stall": "write"}),
    Sent("op-unknown", "notify", {}),
    Sent("op-unreadable", "notify", {"mode": "unreadable"}),
    Sent("op-xray", "record", {"n": 1}, xray_only=True),
)


@dataclass
class SqsRun:
    spans: list[ReadableSpan]
    metrics: MetricsData | None
    producer: SpanContext
    hasher: IdentityHasher

    def named(self, template: str, **fields: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == template.format(**fields)]

    def process_spans(self, operation_id: str) -> list[ReadableSpan]:
        """The process spans of one operation, by attempt."""
        wanted = self.hasher.operation(TENANT, operation_id)
        found = [
            s
            for s in self.named(n.SPAN_PROCESS, subscription=SUBSCRIPTION)
            if (s.attributes or {}).get(n.OPERATION_HASH) == wanted
        ]
        return sorted(found, key=lambda s: int((s.attributes or {})[n.ATTEMPT]))


def send_batch(client: Any, queue_url: str, producer_traceparent: str) -> None:
    for sent in BATCH:
        attributes = {"job_type": sent.job_type}
        if sent.tenant_id is not None:
            attributes["tenant_id"] = sent.tenant_id
        if sent.operation_id is not None:
            attributes["operation_id"] = sent.operation_id
        if not sent.xray_only:
            attributes["traceparent"] = producer_traceparent
        request: dict[str, Any] = {
            "QueueUrl": queue_url,
            "MessageBody": json.dumps(sent.body),
            "MessageAttributes": {
                k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
            },
        }
        if sent.xray_only:
            request["MessageSystemAttributes"] = {
                "AWSTraceHeader": {"DataType": "String", "StringValue": XRAY_HEADER}
            }
        client.send_message(**request)


def queue_empty(client: Any, queue_url: str) -> bool:
    attributes = client.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return all(int(v) == 0 for v in attributes.values())


def settled(store: PostgresStore) -> bool:
    stats = store.operator.stats()
    return (
        stats.total(State.SUCCEEDED) == 5
        and stats.total(State.UNKNOWN) == 1
        and stats.total(State.QUARANTINED) == 1
    )


def leave_gauge_material(store: PostgresStore) -> None:
    """After the run: one queued row and one claim whose lease has already lapsed."""

    def delivery(operation_id: str) -> Delivery:
        return Delivery(
            tenant_id=TENANT,
            operation_id=operation_id,
            subscription=SUBSCRIPTION,
            job_type="record",
            target_class=TargetClass.A,
            payload=b"{}",
        )

    store.inbox.ingest([delivery("op-waiting"), delivery("op-stalled")])
    claims = store.claims.claim_keys(
        "a-worker-that-stalled", [Key(TENANT, "op-stalled")], LAPSED_LEASE
    )
    assert len(claims) == 1
    eventually(
        lambda: store.operator.stats().stalled_claims == 1, "the stalled claim's lease to lapse"
    )


@pytest.fixture(scope="module")
def sqs() -> Iterator[SqsServer]:
    """moto's server, and dummy credentials for the clients the bridge builds itself."""
    with sqs_server() as server, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        yield server


@pytest.fixture(scope="module")
def sqs_run(
    tracing: Tracing, sqs: SqsServer, pg_admin_url: str, pg_template: str
) -> Iterator[SqsRun]:
    """The run the module's tests read; its database lives as long as the module."""
    tracing.exporter.clear()
    hasher = IdentityHasher(SECRET)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(hasher, tracer_provider=tracing.provider, meter_provider=meters)
    client = sqs.client()
    queue_url = sqs.create_queue("telemetry", VisibilityTimeout="30")
    with database_from(pg_admin_url, pg_template) as url:
        create_tables(url)
        store = PostgresStore.connect(url, max_size=16)
        try:
            config = parse_config(
                CONFIG.format(
                    subscription=SUBSCRIPTION, queue_url=queue_url, endpoint=sqs.endpoint
                ),
                file="telemetry.toml",
            )
            writes = StallingWrite(url)
            handlers = {
                "record": RecordEffect(),
                "write": writes,
                "charge": FlakyCharge(),
                "notify": Notify(),
            }
            producer_tracer = tracing.provider.get_tracer("test-producer")
            with producer_tracer.start_as_current_span(
                "orders publish", kind=SpanKind.PRODUCER
            ) as p:
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
                send_batch(client, queue_url, carrier["traceparent"])
            bridge = Bridge(
                config,
                store,
                hasher,
                registry=build_registry(config, handlers=handlers),
                telemetry=telemetry,
            )
            bridge.start()
            try:
                eventually(lambda: settled(store), "every operation to settle or park")
                eventually(
                    lambda: (
                        bridge.pool.counts["lease_lost"] == 1
                        and bridge.pool.counts["fenced_out"] == 1
                    ),
                    "both stalled attempts to conclude",
                )
                eventually(lambda: queue_empty(client, queue_url), "every delivery to be deleted")
            finally:
                bridge.stop(deadline=10)
            leave_gauge_material(store)
            telemetry.observe(store.operator, interval=3600)
            eventually(
                lambda: n.METRIC_STALLED in metric_points(reader.get_metrics_data()),
                "the database gauges' first reading",
            )
            yield SqsRun(tracing.spans(), reader.get_metrics_data(), p.get_span_context(), hasher)
        finally:
            store.close()
            meters.shutdown()


# -- receive and inbox ---------------------------------------------------------------------------


def test_one_receive_span_for_the_batch_linked_to_every_producer(sqs_run: SqsRun) -> None:
    (receive,) = sqs_run.named(n.SPAN_RECEIVE, subscription=SUBSCRIPTION)
    assert receive.kind is SpanKind.CONSUMER
    attributes = dict(receive.attributes or {})
    assert attributes == {
        n.MESSAGING_SYSTEM: n.SYSTEM_SQS,
        n.MESSAGING_OPERATION_TYPE: "receive",
        n.MESSAGING_OPERATION_NAME: "receive",
        n.MESSAGING_SUBSCRIPTION: SUBSCRIPTION,
        n.MESSAGING_BATCH_COUNT: len(BATCH),
    }
    xray = (int(XRAY_TRACE_ID, 16), int(XRAY_PARENT, 16))
    assert linked(receive) == {ids(sqs_run.producer), xray}
    assert len(receive.links) == len(BATCH)  # one link per delivery that carried a context
    assert receive.parent is None  # a consumer span links to producers; it is not their child


def test_the_inbox_write_is_a_child_of_the_receive_span(sqs_run: SqsRun) -> None:
    (receive,) = sqs_run.named(n.SPAN_RECEIVE, subscription=SUBSCRIPTION)
    (write,) = sqs_run.named(n.SPAN_INBOX_WRITE, subscription=SUBSCRIPTION)
    assert write.parent is not None
    assert write.parent.span_id == receive.context.span_id
    assert dict(write.attributes or {}) == {
        n.DB_SYSTEM: "postgresql",
        n.MESSAGING_SUBSCRIPTION: SUBSCRIPTION,
    }


def test_every_delivery_of_the_batch_is_a_decision_event_with_hashed_identity(
    sqs_run: SqsRun,
) -> None:
    (receive,) = sqs_run.named(n.SPAN_RECEIVE, subscription=SUBSCRIPTION)
    events = [dict(e.attributes or {}) for e in receive.events if e.name == n.EVENT_DECISION]
    decisions = [e[n.DECISION] for e in events]
    assert decisions == ["new", "replay", "conflict", "quarantined", *["new"] * 6]
    hasher = sqs_run.hasher
    for sent, event in zip(BATCH, events, strict=True):
        assert event[n.MESSAGING_MESSAGE_ID]  # the broker's id, to find the message
        if sent.tenant_id is None:
            assert event[n.REASON] == "missing_tenant_id"
            assert n.TENANT_HASH not in event
            continue
        assert sent.operation_id is not None
        assert event[n.TENANT_HASH] == hasher.tenant(TENANT)
        assert event[n.OPERATION_HASH] == hasher.operation(TENANT, sent.operation_id)


# -- process spans -------------------------------------------------------------------------------


#: operation → (target class, outcome of each attempt; None where the attempt lost the row)
EXPECTED_RUNS: dict[str, tuple[str, list[str | None]]] = {
    "op-a": ("A", ["succeeded"]),
    "op-charge": ("C", ["queued", "succeeded"]),
    "op-lost": ("B", [None, "succeeded"]),
    "op-fenced": ("B", [None, "succeeded"]),
    "op-unknown": ("D", ["unknown"]),
    "op-unreadable": ("D", ["quarantined"]),
    "op-xray": ("A", ["succeeded"]),
}


def test_one_process_span_per_claim_with_attempt_fence_class_outcome_and_hashes(
    sqs_run: SqsRun,
) -> None:
    processes = sqs_run.named(n.SPAN_PROCESS, subscription=SUBSCRIPTION)
    assert len(processes) == sum(len(o) for _, o in EXPECTED_RUNS.values())
    hasher = sqs_run.hasher
    for operation_id, (target_class, outcomes) in EXPECTED_RUNS.items():
        runs = sqs_run.process_spans(operation_id)
        assert [(s.attributes or {}).get(n.OUTCOME) for s in runs] == outcomes, operation_id
        for attempt, span in enumerate(runs, start=1):
            attributes = dict(span.attributes or {})
            assert span.kind is SpanKind.CONSUMER
            assert span.parent is None
            assert attributes[n.ATTEMPT] == attempt
            assert attributes[n.FENCE] == attempt  # one claim per attempt, fence +1 each
            assert attributes[n.TARGET_CLASS] == target_class
            assert attributes[n.TENANT_HASH] == hasher.tenant(TENANT)
            assert attributes[n.OPERATION_HASH] == hasher.operation(TENANT, operation_id)
            assert attributes[n.MESSAGING_SUBSCRIPTION] == SUBSCRIPTION
            assert attributes[n.MESSAGING_OPERATION_TYPE] == "process"
            assert attributes[n.JOB_TYPE] in ("record", "write", "charge", "notify")
            # A stalled first attempt's row is taken over by the second, which says so.
            expect_takeover = target_class == "B" and attempt == 2
            assert attributes[n.TAKEOVER] is expect_takeover, (operation_id, attempt)
            if operation_id != "op-xray":
                assert linked(span) == {ids(sqs_run.producer)}, (operation_id, attempt)
            # error searches find every run that did not succeed, by status and error.type
            outcome = attributes.get(n.OUTCOME)
            if outcome == "succeeded":
                assert span.status.status_code is StatusCode.UNSET, operation_id
                assert n.ERROR_TYPE not in attributes
            else:
                assert span.status.status_code is StatusCode.ERROR, (operation_id, attempt)
                expected = {attributes[n.OUTCOME_CODE]} if outcome else {"lease_lost", "fenced_out"}
                assert attributes[n.ERROR_TYPE] in expected, (operation_id, attempt)


def test_a_message_with_only_an_aws_trace_header_links_to_the_converted_xray_ids(
    sqs_run: SqsRun,
) -> None:
    (span,) = sqs_run.process_spans("op-xray")
    (link,) = span.links
    assert link.context.trace_id == int(XRAY_TRACE_ID, 16)
    assert link.context.span_id == int(XRAY_PARENT, 16)
    assert link.context.trace_flags.sampled  # Sampled=1
    assert link.context.is_remote


def test_the_class_c_retry_reconciles_in_a_child_span_before_acting(sqs_run: SqsRun) -> None:
    first, second = sqs_run.process_spans("op-charge")
    reconciles = sqs_run.named(n.SPAN_RECONCILE, job_type="charge")
    by_parent: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in reconciles:
        assert span.parent is not None
        by_parent[span.parent.span_id].append(span)
    # Attempt 1: its answer was lost, so it looked the key up: nothing there, retry later.
    # Attempt 2 (attempts > 1): looked up first, found nothing, then charged.
    assert set(by_parent) == {first.context.span_id, second.context.span_id}
    for process, attempt in ((first, 1), (second, 2)):
        (reconcile,) = by_parent[process.context.span_id]
        assert dict(reconcile.attributes or {}) == {
            n.JOB_TYPE: "charge",
            n.FENCE: attempt,
            n.FINDING: "not_applied",
        }
        (event,) = [e for e in process.events if e.name == n.EVENT_RECONCILED]
        assert dict(event.attributes or {}) == {n.FINDING: "not_applied"}
    assert dict(first.attributes or {})[n.OUTCOME_CODE] == "TimeoutError"


def test_lease_lost_fenced_out_and_parked_unknown_are_events_of_their_runs(
    sqs_run: SqsRun,
) -> None:
    def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
        return [(e.name, dict(e.attributes or {})) for e in span.events]

    lost_first, lost_second = sqs_run.process_spans("op-lost")
    assert events(lost_first) == [(n.EVENT_LEASE_LOST, {n.ACTION: "handler"})]
    assert events(lost_second) == []
    fenced_first, fenced_second = sqs_run.process_spans("op-fenced")
    assert events(fenced_first) == [(n.EVENT_FENCED_OUT, {})]
    assert events(fenced_second) == []
    (unknown,) = sqs_run.process_spans("op-unknown")
    assert events(unknown) == [(n.EVENT_PARKED_UNKNOWN, {n.OUTCOME_CODE: "TimeoutError"})]


# -- metrics -------------------------------------------------------------------------------------


def test_counters_by_decision_outcome_and_event(sqs_run: SqsRun) -> None:
    points = metric_points(sqs_run.metrics)
    deliveries = points[n.METRIC_DELIVERIES]
    assert {a[n.LABEL_SUBSCRIPTION] for a, _ in deliveries} == {SUBSCRIPTION}
    assert by_label(deliveries, n.LABEL_DECISION) == {
        "new": 7,
        "replay": 1,
        "conflict": 1,
        "quarantined": 1,
    }
    assert by_label(points[n.METRIC_COMPLETIONS], n.LABEL_OUTCOME) == {
        "succeeded": 5,
        "queued": 1,  # the class C retry
        "unknown": 1,
        "quarantined": 1,
    }
    assert total(points[n.METRIC_COMPLETIONS], job_type="charge", outcome="succeeded") == 1
    assert by_label(points[n.METRIC_TAKEOVERS], n.LABEL_JOB_TYPE) == {"write": 2}
    assert points[n.METRIC_LEASE_LOST][0][0] == {
        n.LABEL_JOB_TYPE: "write",
        n.LABEL_ACTION: "handler",
    }
    assert total(points[n.METRIC_LEASE_LOST]) == 1
    assert points[n.METRIC_FENCED_OUT][0][0] == {n.LABEL_JOB_TYPE: "write"}
    assert total(points[n.METRIC_FENCED_OUT]) == 1
    assert points[n.METRIC_RECONCILIATIONS][0][0] == {
        n.LABEL_JOB_TYPE: "charge",
        n.LABEL_FINDING: "not_applied",
    }
    assert total(points[n.METRIC_RECONCILIATIONS]) == 2


def test_duration_histograms_count_every_commit_ack_and_run_in_seconds_buckets(
    sqs_run: SqsRun,
) -> None:
    points = metric_points(sqs_run.metrics)
    runs = sum(len(o) for _, o in EXPECTED_RUNS.values())
    expected = {
        n.METRIC_INBOX_COMMIT: 1,  # one transaction for the batch
        n.METRIC_RECEIVE_TO_ACK: len(BATCH),  # every delivery deleted after the commit
        n.METRIC_CLAIM_TO_SETTLE: runs,  # every run, including those that lost the row
    }
    for name, count in expected.items():
        assert sum(p.count for _, p in points[name]) == count, name
        for _, point in points[name]:
            assert tuple(point.explicit_bounds) == DURATION_BUCKETS_SECONDS
            assert point.sum > 0
    # The stalled runs outlived their one-second lease; the others finished well inside it.
    slowest = max(p.max for _, p in points[n.METRIC_CLAIM_TO_SETTLE])
    assert slowest > 1.0


def test_database_gauges_after_observe(sqs_run: SqsRun) -> None:
    points = metric_points(sqs_run.metrics)
    ((_, stalled),) = points[n.METRIC_STALLED]
    assert stalled.value == 1
    ((_, oldest),) = points[n.METRIC_OLDEST_UNKNOWN]
    assert oldest.value > 0
    assert by_label(points[n.METRIC_QUARANTINED], n.LABEL_KIND) == {
        "work_row": 1,  # the handler's quarantine
        "delivery": 1,  # the undecodable message
    }
    assert by_label(points[n.METRIC_QUEUE_DEPTH], n.LABEL_SUBSCRIPTION) == {SUBSCRIPTION: 1}


def test_a_drained_subscription_reports_a_queue_depth_of_zero(store: PostgresStore) -> None:
    """A missing series and an empty queue look alike on a dashboard; zero is a reading. The
    gauges read open and parked rows only, so a subscription all of whose rows are settled is
    reported because it is configured, not because its history was counted."""
    store.inbox.ingest(
        [
            Delivery(
                tenant_id=TENANT,
                operation_id="op-done",
                subscription=SUBSCRIPTION,
                job_type="record",
                target_class=TargetClass.A,
                payload=b"{}",
            )
        ]
    )
    (claim,) = store.claims.claim("w", 1, timedelta(seconds=30))
    store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok", outcome_detail=None))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        Telemetry(IdentityHasher(SECRET), meter_provider=meters).observe(
            store.operator, interval=3600, subscriptions=[SUBSCRIPTION]
        )
        eventually(
            lambda: n.METRIC_STALLED in metric_points(reader.get_metrics_data()),
            "the database gauges' first reading",
        )
        points = metric_points(reader.get_metrics_data())
    finally:
        meters.shutdown()
    assert by_label(points[n.METRIC_QUEUE_DEPTH], n.LABEL_SUBSCRIPTION) == {SUBSCRIPTION: 0}
    assert by_label(points[n.METRIC_QUARANTINED], n.LABEL_KIND) == {"work_row": 0, "delivery": 0}
    ((_, stalled),) = points[n.METRIC_STALLED]
    assert stalled.value == 0


def test_rows_waiting_for_a_limit_or_a_rate_are_a_gauge_by_reason(store: PostgresStore) -> None:
    """Due rows a claim skips, by reason, job type and tenant hash (never the tenant id)."""

    def queued(op: str, tenant: str) -> Delivery:
        return Delivery(
            tenant_id=tenant,
            operation_id=op,
            subscription=SUBSCRIPTION,
            job_type="record",
            target_class=TargetClass.A,
            payload=b"{}",
        )

    store.inbox.ingest(
        [
            queued("held", "t-limit"),
            queued("waits", "t-limit"),  # its tenant holds its one slot
            queued("r", "t-rate"),
            queued("sibling", "t-rate"),  # its key waits out the target's limit on r
        ]
    )
    limits = {"record": ConcurrencyLimit(per_tenant=1)}
    store = with_policy(store, concurrency=limits)
    (held,) = store.claims.claim_keys("w", [Key("t-limit", "held")], timedelta(seconds=30))
    (rated,) = store.claims.claim_keys("w", [Key("t-rate", "r")], timedelta(seconds=30))
    store.settle.rate_limited(rated.ticket, timedelta(minutes=5))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    hasher = IdentityHasher(SECRET)
    try:
        Telemetry(hasher, meter_provider=meters).observe(
            store.operator, interval=3600, limits=limits
        )
        eventually(
            lambda: n.METRIC_WAITING in metric_points(reader.get_metrics_data()),
            "the waiting gauge's first reading",
        )
        points = metric_points(reader.get_metrics_data())
    finally:
        meters.shutdown()
    found = {
        (attrs[n.LABEL_REASON], attrs[n.LABEL_TENANT_HASH]): point.value
        for attrs, point in points[n.METRIC_WAITING]
    }
    assert found == {("limit", hasher.tenant("t-limit")): 1, ("rate", hasher.tenant("t-rate")): 1}
    assert held.tenant_id not in str(points[n.METRIC_WAITING])


# -- the reference ------------------------------------------------------------------------------


class LimitedForAYear(ConditionalWriteHandler):
    """A target whose 429 asks for a year's wait (a provider's mistake)."""

    def handle(self, ctx: Context) -> None:
        raise RateLimited(retry_after=timedelta(days=365))


def test_a_rate_limit_wait_cut_to_its_maximum_is_counted(
    store: PostgresStore, db: psycopg.Connection[Any], spans: Tracing
) -> None:
    hasher = IdentityHasher(SECRET)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(hasher, tracer_provider=spans.provider, meter_provider=meters)
    registry = Registry()
    spec = registry.register("limited", LimitedForAYear(), rate_wait_max=timedelta(minutes=5))
    store.inbox.ingest([for_job(registry, "limited", "op-1", tenant=TENANT)])
    (claim,) = store.claims.claim("w", 1, timedelta(seconds=30))
    try:
        with telemetry.process(claim):
            execute(Run(store.settle, claim, spec, Context.for_claim(claim, hasher), telemetry))
        data = reader.get_metrics_data()
    finally:
        meters.shutdown()

    points = metric_points(data)
    assert by_label(points[n.METRIC_RATE_WAIT_CLAMPED], n.LABEL_JOB_TYPE) == {"limited": 1}
    name = n.METRIC_RATE_WAIT_CLAMPED
    assert instruments(data)[name] == documented_metrics()[name]
    (span,) = [s for s in spans.spans() if s.name == n.SPAN_PROCESS.format(subscription="jobs")]
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        (n.EVENT_RATE_WAIT_CLAMPED, {n.RATE_WAIT_ASKED: 365 * 86400.0})
    ]
    waited = db.execute("SELECT next_attempt_at - updated_at FROM work_item").fetchone()
    assert waited == (timedelta(minutes=5),)


def documented_metrics() -> dict[str, Instrument]:
    """The metrics table of docs/telemetry.md: name | kind | unit | labels | description."""
    rows: dict[str, Instrument] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`fencebridge\.[a-z_.]+`", cells[0]):
            labels = tuple(sorted(re.findall(r"`([a-z_]+)`", cells[3])))
            rows[cells[0].strip("`")] = Instrument(cells[1], cells[2].strip("`"), labels, cells[4])
    return rows


#: emitted only when something fails, or waits; a healthy run records none (their instruments are
#: checked by the fault tests, e.g. integration/test_supervision.py for the restarts, and by
#: test_rows_waiting_for_a_limit_or_a_rate_are_a_gauge_by_reason below)
FAULT_ONLY = {
    "fencebridge.thread.restarts",
    "fencebridge.queue.waiting",
    "fencebridge.rate_limit.clamped",  # test_a_rate_limit_wait_cut_to_its_maximum_is_counted
}
#: registered only with outbox destinations configured (the run above has none); checked by
#: integration/test_outbox.py
OUTBOX_ONLY = {
    "fencebridge.outbox.pending",
    "fencebridge.outbox.oldest_pending_age",
    "fencebridge.outbox.parked",
}
#: recorded only by subscriptions with ``wait_for_standby`` (the run above has none)
STANDBY_ONLY = {"fencebridge.standby_wait.duration"}


def test_the_reference_documents_every_emitted_metric_as_emitted(sqs_run: SqsRun) -> None:
    documented = {
        k: v
        for k, v in documented_metrics().items()
        if k not in FAULT_ONLY | OUTBOX_ONLY | STANDBY_ONLY
    }
    assert documented == instruments(sqs_run.metrics)


def test_the_reference_names_every_span_attribute_event_and_label() -> None:
    text = DOC.read_text(encoding="utf-8")
    constants = {
        name: value
        for name, value in vars(n).items()
        if name.isupper() and isinstance(value, str) and name != "INSTRUMENTATION_NAME"
    }
    missing = {name: value for name, value in constants.items() if f"`{value}`" not in text}
    assert not missing, f"docs/telemetry.md does not mention: {missing}"


# -- message ids used as operation ids -----------------------------------------------------------


def test_a_message_id_that_is_the_operation_id_stays_out_of_spans(
    spans: Tracing, store: PostgresStore
) -> None:
    """With ``operation_id = "message_id"`` the broker's id *is* the raw identifier."""
    rules = DecodeRules(
        subscription=SUBSCRIPTION,
        tenant_id=FieldSource.parse("attribute:tenant_id"),
        operation_id=FieldSource.parse("message_id"),
        job_type=FieldSource.parse("value:record"),
        jobs={"record": JobRule(TargetClass.A, 3)},
        max_body_bytes=1024,
        payload=PayloadSource.parse("body"),
    )
    hasher = IdentityHasher(SECRET)
    telemetry = Telemetry(hasher, tracer_provider=spans.provider)
    inbox = Inbox(
        store.inbox, lambda raw: decode(rules, raw), system=n.SYSTEM_SQS, telemetry=telemetry
    )
    raw = RawDelivery(
        subscription=SUBSCRIPTION,
        message_id="msg-0c4e-as-operation",
        body=b"{}",
        attributes={"tenant_id": TENANT},
    )
    (written,) = inbox.write([raw])
    assert written.result.key == Key(TENANT, "msg-0c4e-as-operation")
    (claim,) = store.claims.claim_keys(
        "w", [Key(TENANT, "msg-0c4e-as-operation")], timedelta(seconds=30)
    )
    with telemetry.process(claim):
        pass
    found = spans.spans()
    assert {s.name for s in found} >= {
        n.SPAN_RECEIVE.format(subscription=SUBSCRIPTION),
        n.SPAN_PROCESS.format(subscription=SUBSCRIPTION),
    }
    for span in found:
        values = [*(span.attributes or {}).values()]
        for event in span.events:
            values += [*(event.attributes or {}).values()]
        assert "msg-0c4e-as-operation" not in values, span.name
        assert n.MESSAGING_MESSAGE_ID not in (span.attributes or {})
    process = next(s for s in found if s.name.startswith("process"))
    expected = hasher.operation(TENANT, "msg-0c4e-as-operation")
    assert (process.attributes or {})[n.OPERATION_HASH] == expected


# -- Pub/Sub -------------------------------------------------------------------------------------


PUBSUB_CONFIG = """
[bridge]
worker_id = "telemetry-pubsub"
worker_threads = 2
poll_interval_seconds = 0.1
shutdown_deadline_seconds = 5.0
health_port = 0

[jobs.record]
handler = "tests.support.handlers:RecordEffect"
target_class = "A"
lease_seconds = 10

[subscriptions.{subscription}]
source = "pubsub"
subscription = "{path}"
job_types = ["record"]
batch_max_messages = 10
batch_max_wait_ms = 20

[subscriptions.{subscription}.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:record"
payload = "body"
"""


@pytest.fixture(scope="module")
def pubsub() -> Iterator[Any]:
    """Google's emulator; skipped where it is not installed, a failure under CI."""
    from tests.support.pubsub_emulator import pubsub_emulator, require_launcher  # noqa: PLC0415

    with pubsub_emulator(require_launcher()) as emulator:
        yield emulator


def test_pubsub_producer_context_reaches_the_process_span_in_either_attribute(
    spans: Tracing, pubsub: Any, db_url: str
) -> None:
    from google.cloud import pubsub_v1  # noqa: PLC0415

    from tests.support.pubsub_emulator import with_emulator_host  # noqa: PLC0415

    create_tables(db_url)
    topic, path = pubsub.create()
    hasher = IdentityHasher(SECRET)
    telemetry = Telemetry(hasher, tracer_provider=spans.provider)
    config = parse_config(
        PUBSUB_CONFIG.format(subscription=SUBSCRIPTION, path=path), file="pubsub.toml"
    )
    # A publisher that traces itself: the client injects its own span's context as
    # ``googclient_traceparent``.
    options = pubsub_v1.types.PublisherOptions(enable_open_telemetry_tracing=True)
    traced = with_emulator_host(
        pubsub.host, lambda: pubsub_v1.PublisherClient(publisher_options=options)
    )
    producer_tracer = spans.provider.get_tracer("test-producer")
    with producer_tracer.start_as_current_span("orders publish", kind=SpanKind.PRODUCER) as p:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        pubsub.publish(
            topic,
            b"{}",
            tenant_id=TENANT,
            operation_id="op-w3c",
            traceparent=carrier["traceparent"],
        )
        traced.publish(topic, b"{}", tenant_id=TENANT, operation_id="op-client").result(30)
    traced.stop()
    producer = p.get_span_context()
    (created,) = [
        s for s in spans.spans() if s.kind is SpanKind.PRODUCER and s.name.endswith(" create")
    ]
    assert created.parent is not None
    assert created.parent.span_id == producer.span_id

    store = PostgresStore.connect(db_url, max_size=8)
    try:
        bridge = with_emulator_host(
            pubsub.host,
            lambda: Bridge(
                config,
                store,
                hasher,
                registry=build_registry(config, handlers={"record": RecordEffect()}),
                telemetry=telemetry,
            ),
        )
        bridge.start()
        try:
            eventually(
                lambda: store.operator.stats().total(State.SUCCEEDED) == 2,
                "both operations to succeed",
            )
        finally:
            bridge.stop(deadline=10)
    finally:
        store.close()

    found = spans.spans()
    process = {
        (s.attributes or {})[n.OPERATION_HASH]: s
        for s in found
        if s.name == n.SPAN_PROCESS.format(subscription=SUBSCRIPTION)
    }
    w3c = process[hasher.operation(TENANT, "op-w3c")]
    client = process[hasher.operation(TENANT, "op-client")]
    assert linked(w3c) == {ids(producer)}
    assert linked(client) == {ids(created.context)}
    receives = [s for s in found if s.name == n.SPAN_RECEIVE.format(subscription=SUBSCRIPTION)]
    assert receives
    for receive in receives:
        assert (receive.attributes or {})[n.MESSAGING_SYSTEM] == n.SYSTEM_PUBSUB
    assert set().union(*(linked(r) for r in receives)) == {ids(producer), ids(created.context)}


# -- exporters from the environment --------------------------------------------------------------


SETUP_PROBE = """
import json, sys
from opentelemetry import metrics, trace
from bridge.telemetry.setup import configure_telemetry
setup = configure_telemetry()
print(json.dumps({
    "metrics": setup.metrics,
    "tracer_provider": type(trace.get_tracer_provider()).__name__,
    "meter_provider": type(metrics.get_meter_provider()).__name__,
}))
setup.shutdown()
"""


def run_probe(code: str, env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FENCEBRIDGE_"))}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def probe_setup(env: dict[str, str]) -> dict[str, Any]:
    process = run_probe(SETUP_PROBE, env)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        pytest.param({}, False, False, id="nothing-set"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"},
            False,
            False,
            id="sdk-disabled",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True, True, id="otlp-endpoint"
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"},
            True,
            False,
            id="traces-endpoint-only",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"},
            False,
            True,
            id="traces-exporter-none",
        ),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"},
            True,
            True,
            id="console-without-endpoint",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "TRUE "},
            False,
            False,
            id="sdk-disabled-any-case",
        ),
    ],
)
def test_exporters_are_installed_only_as_the_environment_asks(
    env: dict[str, str], traces: bool, metrics: bool
) -> None:
    found = probe_setup(env)
    assert found["metrics"] is metrics
    assert (found["tracer_provider"] == "TracerProvider") is traces
    assert (found["meter_provider"] == "MeterProvider") is metrics
    if not traces:
        assert found["tracer_provider"] == "ProxyTracerProvider"


CONSOLE_PROBE = """
from opentelemetry import trace
from bridge.telemetry.setup import configure_telemetry
setup = configure_telemetry()
with trace.get_tracer("probe").start_as_current_span("probe span"):
    pass
setup.shutdown()
"""


def test_the_console_exporter_prints_each_span() -> None:
    process = run_probe(CONSOLE_PROBE, {"OTEL_TRACES_EXPORTER": "console"})
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out)["name"] == "probe span"


@pytest.mark.parametrize(
    ("env", "error"),
    [
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "consol"},
            "OTEL_TRACES_EXPORTER: unknown exporter 'consol'; expected a comma-separated list "
            "of: otlp, console, none",
            id="typo",
        ),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "otlp,none"},
            "OTEL_METRICS_EXPORTER: 'none' cannot be combined with other exporters",
            id="none-and-more",
        ),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "the traces exporter 'otlp_proto_grpc' is not installed in this environment",
            id="grpc-not-installed",
        ),
    ],
)
def test_an_exporter_the_environment_cannot_have_is_refused_by_name(
    env: dict[str, str], error: str
) -> None:
    process = run_probe(SETUP_PROBE, env)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert f"ConfigError: {error}" in err


def test_a_logs_exporter_is_reported_as_ignored() -> None:
    process = run_probe(SETUP_PROBE, {"OTEL_LOGS_EXPORTER": "otlp"})
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "OTEL_LOGS_EXPORTER=otlp is ignored" in err


PROMETHEUS_PROBE = """
import sys
from bridge.identity import IdentityHasher
from bridge.telemetry import Telemetry
from bridge.telemetry.setup import configure_telemetry
setup = configure_telemetry()
assert setup.metrics
telemetry = Telemetry(IdentityHasher(b"prometheus-probe-secret-0001"))
telemetry.acked("orders", 0.02)
with telemetry.inbox_write("orders"):
    pass
print("serving", flush=True)
sys.stdin.read()
setup.shutdown()
"""


def test_prometheus_serves_fencebridge_metrics_on_the_configured_port() -> None:
    from tests.support.bridge_process import free_port  # noqa: PLC0415

    port = free_port()
    process = run_probe(
        PROMETHEUS_PROBE, {"FENCEBRIDGE_PROMETHEUS_PORT": str(port)}, stdin=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "serving", process.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        _, err = process.communicate(input="", timeout=60)
    assert process.returncode == 0, err
    assert "# TYPE fencebridge_receive_to_ack_duration_seconds histogram" in text
    assert "fencebridge_receive_to_ack_duration_seconds_count{" in text
    assert 'subscription="orders"' in text
    assert "# TYPE fencebridge_inbox_commit_duration_seconds histogram" in text
    # bounds in seconds, not the SDK's millisecond defaults
    assert 'fencebridge_inbox_commit_duration_seconds_bucket{le="0.005"' in text
