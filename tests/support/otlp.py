"""An OTLP/HTTP collector for tests, and what a process exported to it, read back.

The bridge runs as a real process exporting over OTLP/HTTP (protobuf); the collector keeps every
request body, decompressed, and :func:`read_exports` turns them into every string they hold and
the spans and metrics by name, for the privacy scans and the trace tests.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

# -- an OTLP/HTTP collector ----------------------------------------------------------------------


@dataclass
class Collector:
    """Accepts OTLP/HTTP exports and keeps every request body, decompressed."""

    server: ThreadingHTTPServer
    requests: list[tuple[str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def bodies(self, path: str) -> list[bytes]:
        with self.lock:
            return [body for p, body in self.requests if p == path]


@contextmanager
def otlp_collector() -> Iterator[Collector]:
    """A collector on a free port of 127.0.0.1, shut down on exit."""
    received: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    class Receive(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            encoding = self.headers.get("Content-Encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            with lock:
                received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Collector(server, received, lock)
    finally:
        server.shutdown()
        server.server_close()


def any_value(value: AnyValue) -> list[str]:
    """Every string inside an OTLP attribute value (arrays and maps included)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [s for v in value.array_value.values for s in any_value(v)]
    if kind == "kvlist_value":
        return [s for kv in value.kvlist_value.values for s in key_value(kv)]
    if kind == "bytes_value":
        return [value.bytes_value.decode("utf-8", "replace")]
    return [str(getattr(value, kind))] if kind else []


def key_value(kv: KeyValue) -> list[str]:
    return [kv.key, *any_value(kv.value)]


@dataclass(frozen=True)
class Span:
    """One exported span, with what places it in its trace."""

    name: str
    scope: str
    trace_id: str
    span_id: str
    #: empty for a root span
    parent_id: str
    attributes: dict[str, str]
    #: the status code's name: ``STATUS_CODE_UNSET``, ``STATUS_CODE_OK`` or ``STATUS_CODE_ERROR``
    status: str
    start_ns: int
    end_ns: int
    #: (trace id, span id) of each link
    links: tuple[tuple[str, str], ...] = ()


@dataclass
class Exported:
    """Every string the OTLP exports held, the spans and metrics by name, and every span."""

    strings: list[str] = field(default_factory=list)
    spans: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    metrics: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    records: list[Span] = field(default_factory=list)


def attributes(kvs: Any) -> dict[str, str]:
    return {kv.key: " ".join(any_value(kv.value)) for kv in kvs}


def read_exports(collector: Collector) -> Exported:
    out = Exported()
    for body in collector.bodies("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            out.strings += [s for kv in resource.resource.attributes for s in key_value(kv)]
            for scope in resource.scope_spans:
                for span in scope.spans:
                    fields = attributes(span.attributes)
                    out.strings += [span.name, *fields, *fields.values()]
                    out.spans.setdefault(span.name, []).append(fields)
                    for event in span.events:
                        event_fields = attributes(event.attributes)
                        out.strings += [event.name, *event_fields, *event_fields.values()]
                        out.spans.setdefault(f"event:{event.name}", []).append(event_fields)
                    for link in span.links:
                        out.strings += [s for kv in link.attributes for s in key_value(kv)]
                    out.records.append(
                        Span(
                            span.name,
                            scope.scope.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            fields,
                            Status.StatusCode.Name(span.status.code),
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                        )
                    )
    for body in collector.bodies("/v1/metrics"):
        request = ExportMetricsServiceRequest.FromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points if kind else []
                    for point in points:
                        labels = attributes(point.attributes)
                        out.strings += [metric.name, *labels, *labels.values()]
                        out.metrics.setdefault(metric.name, []).append(labels)
    return out
