"""Every call of an operation inside its trace, at volume, with nothing raw in any span.

``fencebridge run`` as a real process with the official instrumentations installed and its
traces exported over OTLP/HTTP to a collector this test runs: 1,000 class C charges over moto's
SQS from eight tenants whose ids are distinctive raw strings, with 100 duplicates, 20 changed
payloads (conflicts) and 10 the provider refuses, while the provider applies 60 charges and then
loses its answer (a 500, a reset), so those runs end ambiguous and their next claim looks the
key up. The handler calls the provider through requests, httpx and urllib3 in turn, with the
raw tenant and operation ids in the URL's path and query and the idempotency key in a header.

What must hold: each operation charged once; every statement, SQS call and provider call that
was exported has a parent that was exported too, and reaches one of fencebridge's spans (a
statement under ``inbox write``, a delete under ``ack``, a provider call under ``process`` or
``reconcile``); a run that did not succeed has the error status; and no raw identifier,
idempotency key or payload byte is in any exported byte.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import requests
import urllib3
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge.demo.payments import PROVIDER_URL_ENV
from bridge.demo.provider import FaultKind, PaymentProvider
from bridge.handlers import (
    Ambiguous,
    Applied,
    CannotTell,
    Context,
    IdempotentApiHandler,
    NotApplied,
    RetryLater,
    Success,
    TerminalFailure,
)
from bridge.telemetry import names as n
from tests.support import waterfall
from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.otlp import Collector, Exported, Span, otlp_collector, read_exports
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

pytest.importorskip("opentelemetry.instrumentation.psycopg", reason="the instrumentation extra")
pytestmark = pytest.mark.slow

TENANTS = [f"tenant-RAW-{i:02d}x9" for i in range(8)]
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 20
REFUSED = 10
LOST_ANSWERS = 30  # of each kind: applied, then a 500; applied, then the connection reset
PAYLOAD_MARK = "PAYLOAD-RAW-e41f"
OURS = n.INSTRUMENTATION_NAME
#: where to write the waterfall of one operation (docs/images/trace.svg is made this way)
PICTURE_ENV = "FENCEBRIDGE_TRACE_PICTURE"
PICTURE_TITLE = "One class C charge whose first answer was lost: producer to settled"


def operation_id(i: int) -> str:
    return f"op-RAW-{i:05d}q"


class TracedCharge(IdempotentApiHandler):
    """Class C over three HTTP clients in turn, raw ids in the URL as careless code puts them."""

    def __init__(self) -> None:
        self._url = os.environ[PROVIDER_URL_ENV]
        self._http = urllib3.PoolManager()

    def _target(self, ctx: Context) -> str:
        return f"{self._url}/v1/charges?tenant={ctx.tenant_id}&operation={ctx.operation_id}"

    def validate(self, ctx: Context) -> None:
        ctx.json()

    def perform(self, ctx: Context, key: str) -> Success:
        body = ctx.json()
        charge = {"amount": body["amount"], "currency": body["currency"]}
        headers = {"Idempotency-Key": key}
        client = sum(key.encode()) % 3
        try:
            if client == 0:
                status = requests.post(
                    self._target(ctx), json=charge, headers=headers, timeout=2
                ).status_code
            elif client == 1:
                status = httpx.post(
                    self._target(ctx), json=charge, headers=headers, timeout=2
                ).status_code
            else:
                status = self._http.request(
                    "POST", self._target(ctx), json=charge, headers=headers, timeout=2.0
                ).status
        except (requests.RequestException, httpx.HTTPError, urllib3.exceptions.HTTPError) as exc:
            raise Ambiguous("provider_connection_error") from exc
        if status == 200:
            return Success("charged")
        if status == 409:
            raise RetryLater("provider_in_progress")
        if status >= 500:
            raise Ambiguous("provider_server_error")
        raise TerminalFailure("provider_rejected", f"the provider answered {status}")

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        try:
            answer = requests.get(
                f"{self._url}/v1/charges", params={"idempotency_key": key}, timeout=2
            )
        except requests.RequestException as exc:
            raise CannotTell(type(exc).__name__) from exc
        if answer.status_code == 200:
            return Applied("charged")
        if answer.status_code == 404:
            return NotApplied()
        raise CannotTell(f"lookup answered {answer.status_code}")


@pytest.fixture(scope="module")
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture
def collector() -> Iterator[Collector]:
    with otlp_collector() as running:
        yield running


def messages(producer: trace.Tracer) -> list[dict[str, object]]:
    """Every delivery, shuffled: operations, duplicates, conflicts and refused charges, each
    published under a producer span whose context travels in ``traceparent``."""
    rng = random.Random(44)
    out = []
    for i in range(OPERATIONS):
        currency = "us1" if i < REFUSED else "usd"
        body = {"amount": 100 + i, "currency": currency, "note": PAYLOAD_MARK}
        out.append((TENANTS[i % len(TENANTS)], operation_id(i), body))
    for i in rng.sample(range(REFUSED, OPERATIONS), DUPLICATES):
        out.append(out[i])
    for i in rng.sample(range(REFUSED, OPERATIONS), CONFLICTS):
        tenant, op, body = out[i]
        out.append((tenant, op, {**body, "amount": 1}))
    rng.shuffle(out)
    sent = []
    for tenant, op, body in out:
        carrier: dict[str, str] = {}
        with producer.start_as_current_span("publish traced", kind=trace.SpanKind.PRODUCER):
            TraceContextTextMapPropagator().inject(carrier)
        attributes = {"tenant_id": tenant, "operation_id": op, "job_type": "charge", **carrier}
        sent.append(
            {
                "MessageBody": json.dumps(body),
                "MessageAttributes": {
                    k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
                },
            }
        )
    return sent


def states(url: str) -> Counter[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return Counter({str(state): int(count) for state, count in rows})


def ancestors(span: Span, by_id: dict[str, Span]) -> list[Span]:
    chain = []
    while span.parent_id and span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain.append(span)
    return chain


def test_each_operations_calls_sit_under_its_spans_and_nothing_raw_is_exported(
    sqs: SqsServer, collector: Collector, db_url: str, tmp_path: Path
) -> None:
    client = sqs.client()
    queue_url = sqs.create_queue("traced", VisibilityTimeout="30")
    published = InMemorySpanExporter()
    producer_provider = TracerProvider()
    producer_provider.add_span_processor(SimpleSpanProcessor(published))
    with PaymentProvider() as provider:
        provider.set_fault(FaultKind.APPLY_THEN_500, times=LOST_ANSWERS)
        provider.set_fault(FaultKind.RESET_AFTER_APPLY, times=LOST_ANSWERS)
        env = bridge_env(
            db_url,
            extra={
                PROVIDER_URL_ENV: provider.url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "OTEL_BSP_MAX_QUEUE_SIZE": "200000",
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2048",
                "OTEL_METRICS_EXPORTER": "none",
            },
        )
        jobs = {"charge": Job(f"{__name__}:TracedCharge", "C", lease_seconds=5.0)}
        config = SqsBridgeConfig(
            queue_url=queue_url, endpoint_url=sqs.endpoint, jobs=jobs, worker_threads=8
        )
        expected = Counter({"succeeded": OPERATIONS - REFUSED, "failed_terminal": REFUSED})
        with BridgeProcess.start(config, tmp_path, env) as bridge:
            bridge.wait_ready()
            batch = messages(producer_provider.get_tracer("producer"))
            for start in range(0, len(batch), 10):
                entries = [{"Id": str(j), **m} for j, m in enumerate(batch[start : start + 10])]
                client.send_message_batch(QueueUrl=queue_url, Entries=entries)
            try:
                eventually(lambda: states(db_url) == expected, "every operation to end", 240)
            except AssertionError as exc:
                raise AssertionError(
                    f"{states(db_url)}; the bridge's log ends:\n{bridge.logs()[-4000:]}"
                ) from exc
            assert bridge.terminate() == 0, bridge.logs()  # flushes the exporter on the way out
        ledger = provider.ledger()
    keys = Counter(charge.idempotency_key for charge in ledger)
    assert len(keys) == OPERATIONS - REFUSED, "each operation charged"
    assert max(keys.values()) == 1, "and none twice"

    exported = read_exports(collector)
    spans = exported.records
    by_id = {s.span_id: s for s in spans}
    scopes = Counter(s.scope for s in spans)
    instrumented = [s for s in spans if s.scope != OURS]
    for scope in ("psycopg", "botocore", "requests", "httpx", "urllib3"):
        assert any(scope in name for name in scopes), (scope, scopes)

    strays = [s for s in instrumented if s.parent_id not in by_id]
    assert strays == [], f"{len(strays)} calls outside any exported span: {strays[:3]}"
    for span in instrumented:
        assert any(a.scope == OURS for a in ancestors(span, by_id)), span

    def under(scope: str) -> set[str]:
        return {
            next(a.name for a in ancestors(s, by_id) if a.scope == OURS)
            for s in instrumented
            if scope in s.scope
        }

    assert "inbox write orders" in under("psycopg")
    assert under("botocore") == {"ack orders"}
    for client_scope in ("requests", "httpx", "urllib3"):
        assert under(client_scope) <= {"process orders", "reconcile charge"}, client_scope
    assert "reconcile charge" in under("requests"), "the lookups after the lost answers"

    process = [s for s in spans if s.name == "process orders"]
    failed = [s for s in process if s.attributes.get(n.OUTCOME) == "failed_terminal"]
    assert len(failed) == REFUSED
    assert {s.status for s in failed} == {"STATUS_CODE_ERROR"}
    # Each lost answer makes its run look the key up before it settles: a reconcile span
    # under the run's process span, and the run still ends succeeded.
    reconciled = [s for s in spans if s.name == "reconcile charge"]
    assert len(reconciled) >= 2 * LOST_ANSWERS
    assert {by_id[s.parent_id].name for s in reconciled} == {"process orders"}

    producers = [record(s) for s in published.get_finished_spans()]
    linked = {link for s in process for link in s.links}
    assert len(process) >= OPERATIONS, "a process span for each run"
    assert all(s.links for s in process), "each run linked to its producer"
    assert linked <= {(p.trace_id, p.span_id) for p in producers}

    assert_nothing_raw(exported, collector, list(keys))
    picture = os.environ.get(PICTURE_ENV)
    if picture:
        chosen = one_operation(spans, producers, by_id)
        Path(picture).write_text(
            waterfall.render(chosen, ours=OURS, title=PICTURE_TITLE), encoding="utf-8"
        )


def record(span: ReadableSpan) -> Span:
    """A span of this process, as the collector's records are."""
    context = span.get_span_context()
    assert context is not None
    assert span.start_time is not None
    assert span.end_time is not None
    return Span(
        span.name,
        "producer",
        format(context.trace_id, "032x"),
        format(context.span_id, "016x"),
        "",
        {},
        "STATUS_CODE_UNSET",
        span.start_time,
        span.end_time,
    )


def one_operation(spans: list[Span], producers: list[Span], by_id: dict[str, Span]) -> list[Span]:
    """An operation whose first answer was lost: its producer, receive, ack and every run."""

    def below(roots: list[Span]) -> list[Span]:
        ids = {r.span_id for r in roots}
        return [
            s for s in spans if s.span_id in ids or ids & {a.span_id for a in ancestors(s, by_id)}
        ]

    reconcile = next(s for s in spans if s.name == "reconcile charge")
    operation = by_id[reconcile.parent_id].attributes[n.OPERATION_HASH]
    runs = [
        s
        for s in spans
        if s.name == "process orders" and s.attributes.get(n.OPERATION_HASH) == operation
    ]
    link = runs[0].links[0]
    producer = next(p for p in producers if (p.trace_id, p.span_id) == link)
    receive = min(
        (s for s in spans if s.name == "receive orders" and link in s.links),
        key=lambda s: s.start_ns,
    )
    ack = min(
        (s for s in spans if s.name == "ack orders" and s.start_ns >= receive.end_ns),
        key=lambda s: s.start_ns,
    )
    return [producer, *below([receive, ack, *runs])]


def assert_nothing_raw(exported: Exported, collector: Collector, keys: list[str]) -> None:
    raw = [*TENANTS, "op-RAW-", PAYLOAD_MARK, *keys]
    bodies = collector.bodies("/v1/traces")
    assert bodies
    for body in bodies:
        text = body.decode("utf-8", "replace")
        assert not [r for r in raw if r in text], "a raw identifier in an OTLP export"
    for text in exported.strings:
        assert not [r for r in raw if r in text], text
