"""The official OpenTelemetry instrumentations under fencebridge's spans, where installed.

With the ``instrumentation`` extra installed and traces exported, ``fencebridge run`` wires each
instrumentation it finds: psycopg (every statement), botocore (SQS, SNS, DynamoDB calls), gRPC
(Pub/Sub), and the HTTP clients a handler may use (httpx, requests, urllib3). The SDK's own
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` (names separated by commas, as listed in
:data:`INSTRUMENTATIONS`) leaves some out. Without the extra nothing is imported and nothing
changes.

**Only inside an operation's trace.** Most calls a bridge makes belong to no operation: claim
polls, lease renewals, the sweeper, the gauges, long-poll receives, the client libraries' own
threads. Traced, each would start a trace of its own, thousands a minute, none of them
answering "where did this operation's time go". :class:`InsideOurSpans` keeps a call's span
only when it has a parent (a statement inside ``inbox write``, a provider call inside
``process``): a client span that would begin a trace of its own is dropped before it is
recorded, so it costs almost nothing, unless it is fencebridge's own ``ack``.

**Nothing raw.** psycopg records the statement text, never its parameters, and every value
fencebridge sends is a parameter; SQL comments stay off. The HTTP client spans keep the method,
the server, the status and the duration: the path, the query and any user information are cut
from the URL before the span is exported, because a provider's idempotency key, a tenant or an
operation id may ride in them. The instrumentations' header capture
(``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*``) is refused at start: an idempotency key is
sent as a header.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from bridge.errors import ConfigError
from bridge.telemetry import names as n

_log = logging.getLogger("fencebridge.telemetry")

DISABLED_ENV: Final = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
#: the instrumentations' variables that would record request or response headers
HEADER_CAPTURE_PREFIX: Final = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_"
#: URL attributes an HTTP client span may carry, in either generation of the conventions
_URL_KEYS: Final = ("url.full", "http.url")


def scrubbed(url: str) -> str:
    """``scheme://host[:port]`` of a URL: no user information, path, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def _scrub_span(span: Any) -> None:
    attributes: Mapping[str, object] = getattr(span, "attributes", None) or {}
    for key in _URL_KEYS:
        value = attributes.get(key)
        if isinstance(value, str):
            span.set_attribute(key, scrubbed(value))


def _requests_hook(span: Any, *_args: object) -> None:
    _scrub_span(span)


@dataclass(frozen=True, slots=True)
class Instrumentation:
    """One official instrumentation: where its instrumentor lives, and how it is called."""

    module: str
    instrumentor: str
    options: Callable[[], dict[str, object]] = field(default=dict)


#: by the name ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` uses for it
INSTRUMENTATIONS: Final[dict[str, Instrumentation]] = {
    "psycopg": Instrumentation(
        "opentelemetry.instrumentation.psycopg",
        "PsycopgInstrumentor",
        lambda: {"enable_commenter": False, "skip_dep_check": True},
    ),
    "botocore": Instrumentation("opentelemetry.instrumentation.botocore", "BotocoreInstrumentor"),
    "grpc_client": Instrumentation("opentelemetry.instrumentation.grpc", "GrpcInstrumentorClient"),
    "httpx": Instrumentation(
        "opentelemetry.instrumentation.httpx",
        "HTTPXClientInstrumentor",
        lambda: {"request_hook": _requests_hook, "async_request_hook": _async_hook},
    ),
    "requests": Instrumentation(
        "opentelemetry.instrumentation.requests",
        "RequestsInstrumentor",
        lambda: {"request_hook": _requests_hook},
    ),
    "urllib3": Instrumentation(
        "opentelemetry.instrumentation.urllib3",
        "URLLib3Instrumentor",
        lambda: {"request_hook": _requests_hook},
    ),
}


async def _async_hook(span: Any, *_args: object) -> None:
    _scrub_span(span)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def disabled() -> set[str]:
    raw = os.environ.get(DISABLED_ENV, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def refuse_header_capture() -> None:
    """An instrumentation told to record headers would record an idempotency key: refused."""
    asked = sorted(k for k, v in os.environ.items() if k.startswith(HEADER_CAPTURE_PREFIX) and v)
    if asked:
        raise ConfigError(
            f"{', '.join(asked)}: fencebridge does not let an instrumentation record HTTP "
            "headers (an idempotency key or a tenant travels in them); unset it"
        )


def available() -> list[str]:
    """The instrumentations installed and not disabled, by name."""
    off = disabled()
    return [
        name
        for name, spec in INSTRUMENTATIONS.items()
        if name not in off and _installed(spec.module)
    ]


def wire(provider: trace.TracerProvider) -> list[str]:
    """Instrument with every installed, enabled instrumentation; the names wired, in order."""
    refuse_header_capture()
    wired: list[str] = []
    for name in available():
        spec = INSTRUMENTATIONS[name]
        instrumentor = getattr(importlib.import_module(spec.module), spec.instrumentor)()
        if instrumentor.is_instrumented_by_opentelemetry:
            wired.append(name)
            continue
        instrumentor.instrument(tracer_provider=provider, **spec.options())
        wired.append(name)
    if wired:
        _log.info("instrumented under fencebridge's spans: %s", ", ".join(wired))
    return wired


def unwire() -> None:
    """Undo :func:`wire` (tests, and a process that configures telemetry twice)."""
    for spec in INSTRUMENTATIONS.values():
        if _installed(spec.module):
            instrumentor = getattr(importlib.import_module(spec.module), spec.instrumentor)()
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()


class InsideOurSpans(Sampler):
    """Drops a client call's span that would start a trace of its own; keeps everything else.

    Every instrumented call (a statement, a broker or HTTP request) is a span of kind client;
    with no parent it belongs to no operation. fencebridge's own client span (``ack``) carries
    the subscription's name from its start, which no instrumentation sets, and is kept; so is
    any span of another kind (a handler's own root span). Whatever is kept is then decided by
    ``root`` (the sampler ``OTEL_TRACES_SAMPLER`` names, parent-based by default).
    """

    def __init__(self, root: Sampler) -> None:
        self._root = root

    def should_sample(  # noqa: PLR0917  (the SDK's signature)
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        ours = bool(attributes and n.MESSAGING_SUBSCRIPTION in attributes)
        if not parent.is_valid and kind is SpanKind.CLIENT and not ours:
            return SamplingResult(Decision.DROP)
        return self._root.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"InsideOurSpans{{{self._root.get_description()}}}"
