"""The official instrumentations under fencebridge's spans: children kept, strays dropped.

In one process, against the real PostgreSQL and a real HTTP server: a statement and a provider
call made inside a span of fencebridge's are recorded as its children; the same calls made
outside any span (a claim poll, a lease renewal) start no trace; the HTTP span keeps the
server and drops the path and query that carried raw identifiers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
import requests
import urllib3
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

from bridge.errors import ConfigError
from bridge.telemetry import instrument
from bridge.telemetry import names as n

TENANT = "tenant-RAW-3b1d"
OPERATION = "op-RAW-77aa"

pytest.importorskip("opentelemetry.instrumentation.psycopg", reason="the instrumentation extra")


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exported = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=instrument.InsideOurSpans(ParentBased(ALWAYS_ON)))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exported))
    wired = instrument.wire(tracer_provider)
    assert {"psycopg", "requests", "urllib3"} <= set(wired)
    try:
        yield tracer_provider, exported
    finally:
        instrument.unwire()
        tracer_provider.shutdown()


@pytest.fixture
def provider_api() -> Iterator[str]:
    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_calls_inside_our_spans_are_children_and_calls_outside_start_no_trace(
    provider: tuple[TracerProvider, InMemorySpanExporter], db_url: str, provider_api: str
) -> None:
    tracer_provider, exported = provider
    tracer = tracer_provider.get_tracer("fencebridge")
    url = f"{provider_api}/v1/tenants/{TENANT}/refunds?idempotency_key={OPERATION}"
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT 1 AS outside")  # a background statement: no trace
        requests.post(url, timeout=5)
        with tracer.start_as_current_span(
            "process refunds", attributes={n.MESSAGING_SUBSCRIPTION: "refunds"}
        ) as root:
            conn.execute("SELECT %s::text AS inside", (OPERATION,))
            requests.post(url, timeout=5, headers={"Idempotency-Key": OPERATION})
            urllib3.PoolManager().request("POST", url)
        with tracer.start_as_current_span("a handler's own root span") as own:
            conn.execute("SELECT 2")  # kept: a root of another kind than client is untouched

    spans = exported.get_finished_spans()
    roots = sorted(s.name for s in spans if s.parent is None)
    assert roots == ["a handler's own root span", "process refunds"]
    children = [s for s in spans if _parent(s) == root.get_span_context().span_id]
    statements = [s for s in children if (s.attributes or {}).get("db.system") == "postgresql"]
    http = [s for s in children if s not in statements]
    assert len(statements) == 1, [s.name for s in spans]
    assert len(http) >= 2, "requests, and urllib3 under it or on its own"
    own_children = [s for s in spans if _parent(s) == own.get_span_context().span_id]
    assert len(own_children) == 1
    assert len(spans) == 2 + len(children) + 1, "no statement or call outside a span was kept"
    for span in spans:
        text = repr(dict(span.attributes or {})) + span.name
        assert TENANT not in text, text
        assert OPERATION not in text, text
    for span in http:
        attributes = dict(span.attributes or {})
        urls = [attributes[k] for k in ("url.full", "http.url") if k in attributes]
        assert urls, attributes
        assert all(u == provider_api for u in urls), attributes


def test_an_instrumentation_told_to_record_headers_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST", "Idempotency-Key"
    )
    with pytest.raises(ConfigError, match="CAPTURE_HEADERS_CLIENT_REQUEST"):
        instrument.wire(TracerProvider())


def test_without_the_packages_nothing_is_wired_and_nothing_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = {
        name: instrument.Instrumentation(f"not_installed_{name}.instrumentation", "Nothing")
        for name in instrument.INSTRUMENTATIONS
    }
    monkeypatch.setattr(instrument, "INSTRUMENTATIONS", missing)
    assert instrument.available() == []
    assert instrument.wire(TracerProvider()) == []


def test_the_disabled_variable_leaves_an_instrumentation_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(instrument.DISABLED_ENV, "psycopg, grpc_client")
    names = instrument.available()
    assert "psycopg" not in names
    assert "grpc_client" not in names
    assert "requests" in names


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://user:secret@api.example.com:8443/v1/x?key=k#f", "https://api.example.com:8443"),
        ("http://[::1]:8080/refunds/op-1", "http://[::1]:8080"),
        ("https://api.example.com/", "https://api.example.com"),
    ],
)
def test_a_url_keeps_its_scheme_host_and_port_only(url: str, kept: str) -> None:
    assert instrument.scrubbed(url) == kept
