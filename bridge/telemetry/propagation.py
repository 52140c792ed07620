"""The producer's trace context, taken from message attributes.

Preference order: a W3C ``traceparent`` attribute (OpenTelemetry producers), the Pub/Sub
client's own ``googclient_traceparent``, then SQS's X-Ray ``AWSTraceHeader`` converted to W3C.
Whatever is found is validated and kept on the work row as a W3C ``traceparent`` string, so the
process span can link back to the producer even when it runs much later, in another process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_XRAY_ROOT = re.compile(r"^1-([0-9a-f]{8})-([0-9a-f]{24})$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_propagator = TraceContextTextMapPropagator()

ATTRIBUTE_NAMES = ("traceparent", "googclient_traceparent")


def valid_traceparent(value: str | None) -> str | None:
    """The value if it is a usable W3C traceparent (version 00, non-zero ids), else None."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if not match or set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
        return None
    return match.group(0)


def from_xray(header: str | None) -> str | None:
    """``Root=1-5759e988-bd86...;Parent=53995c3f42cd8ad8;Sampled=1`` as a W3C traceparent."""
    if not header:
        return None
    parts = dict(part.strip().split("=", 1) for part in header.split(";") if "=" in part)
    root = _XRAY_ROOT.match(parts.get("Root", "").lower())
    parent = parts.get("Parent", "").lower()
    if not root or not _HEX16.match(parent):
        return None
    flags = "01" if parts.get("Sampled") == "1" else "00"
    return valid_traceparent(f"00-{root.group(1)}{root.group(2)}-{parent}-{flags}")


def producer_traceparent(
    attributes: Mapping[str, str], aws_trace_header: str | None = None
) -> str | None:
    """The best producer context a delivery carries, as a traceparent, or None."""
    for name in ATTRIBUTE_NAMES:
        found = valid_traceparent(attributes.get(name))
        if found:
            return found
    return from_xray(aws_trace_header)


def link_to(traceparent: str | None) -> trace.Link | None:
    """A span link to the producer's span, for consumer spans that must not become children."""
    value = valid_traceparent(traceparent)
    if value is None:
        return None
    ctx = _propagator.extract({"traceparent": value})
    span_context = trace.get_current_span(ctx).get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None
