"""Wiring OpenTelemetry exporters from the standard environment, and nothing by default.

The SDK's standard variables choose the exporters, per signal:

* ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: a comma-separated list of ``otlp``,
  ``console``, ``none``, ``prometheus`` (metrics only) or the name of any exporter installed
  under the SDK's entry points (``opentelemetry_traces_exporter`` /
  ``opentelemetry_metrics_exporter``). A name that is neither is refused at start with the
  names that would work: a typo must not silently export nothing.
* Unset, traces and metrics go to OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
  signal-specific ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT``) is set, and
  nowhere otherwise: unlike the SDK's own default, a bridge with no collector configured does
  not keep failing to reach one on localhost.
* ``otlp`` uses ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal variable): ``http/protobuf``
  (the default) is installed; ``grpc`` needs the SDK's gRPC exporter package.
* Metrics are also served for Prometheus to scrape when ``FENCEBRIDGE_PROMETHEUS_PORT`` is set
  (address ``FENCEBRIDGE_PROMETHEUS_HOST``, default 127.0.0.1), or with the ``prometheus``
  exporter on ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT`` (defaults localhost:9464).
* ``OTEL_LOGS_EXPORTER`` other than ``none`` is reported once as ignored: the bridge's logs go
  to stderr, for the platform's log collector.
* The official instrumentations (psycopg, botocore, gRPC, httpx, requests, urllib3) are wired
  under fencebridge's spans when traces are exported and the ``instrumentation`` extra is
  installed; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` leaves some out
  (:mod:`bridge.telemetry.instrument`).
* Every other ``OTEL_*`` variable (headers, timeouts, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SDK_DISABLED``) is read by the SDK itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Final, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import MetricReader

from bridge.errors import ConfigError
from bridge.telemetry import instrument

PROMETHEUS_PORT_ENV = "FENCEBRIDGE_PROMETHEUS_PORT"
PROMETHEUS_HOST_ENV = "FENCEBRIDGE_PROMETHEUS_HOST"
SERVICE_NAME_DEFAULT = "fencebridge"

_log = logging.getLogger("fencebridge.telemetry")
Signal = Literal["traces", "metrics"]
_BUILT_IN: Final[dict[Signal, tuple[str, ...]]] = {
    "traces": ("otlp", "console", "none"),
    "metrics": ("otlp", "console", "prometheus", "none"),
}
_OTLP_BY_PROTOCOL: Final = {
    "http/protobuf": "otlp_proto_http",
    "grpc": "otlp_proto_grpc",
    "http/json": "otlp_proto_http_json",
}


def _disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _endpoint_set(signal: Signal) -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    )


def exporter_names(signal: Signal) -> list[str]:
    """The exporters the environment asks for, checked: unknown names are a ConfigError."""
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    raw = os.environ.get(variable)
    if _disabled():
        return []
    if raw is None or not raw.strip():
        return ["otlp"] if _endpoint_set(signal) else []
    names = [part.strip().lower() for part in raw.split(",") if part.strip()]
    installed = sorted(e.name for e in entry_points(group=f"opentelemetry_{signal}_exporter"))
    for name in names:
        if name not in _BUILT_IN[signal] and name not in installed:
            known = ", ".join(dict.fromkeys([*_BUILT_IN[signal], *installed]))
            raise ConfigError(
                f"{variable}: unknown exporter {name!r}; expected a comma-separated list of: "
                f"{known}"
            )
    if "none" in names:
        if len(names) > 1:
            raise ConfigError(f"{variable}: 'none' cannot be combined with other exporters")
        return []
    return names


def _entry_point(signal: Signal, name: str) -> Any:
    """The exporter class an installed entry point names; `otlp` follows the protocol."""
    if name == "otlp":
        variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
        protocol = (
            os.environ.get(variable) or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
        ).strip() or "http/protobuf"
        if protocol not in _OTLP_BY_PROTOCOL:
            raise ConfigError(
                f"OTLP protocol {protocol!r} is not one of: {', '.join(_OTLP_BY_PROTOCOL)}"
            )
        name = _OTLP_BY_PROTOCOL[protocol]
    group = f"opentelemetry_{signal}_exporter"
    for entry in entry_points(group=group, name=name):
        return entry.load()
    raise ConfigError(
        f"the {signal} exporter {name!r} is not installed in this environment; install its "
        "OpenTelemetry package or choose another exporter (OTLP over http/protobuf is built in)"
    )


def _warn_about_logs() -> None:
    value = os.environ.get("OTEL_LOGS_EXPORTER", "").strip().lower()
    if value and value != "none":
        _log.warning(
            "OTEL_LOGS_EXPORTER=%s is ignored: fencebridge writes its logs to stderr for the "
            "platform's log collector (FENCEBRIDGE_LOG_FORMAT=json for JSON lines)",
            value,
        )


@dataclass(frozen=True)
class TelemetrySetup:
    #: metrics are exported somewhere, so database gauges are worth refreshing
    metrics: bool
    #: flushes and stops the exporters
    shutdown: Callable[[], None]


def _install_traces(names: list[str], resource: Any) -> Callable[[], object]:
    from opentelemetry.sdk.trace import TracerProvider, sampling  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    wanted = instrument.available()
    # With instrumentations, a call that is part of no operation starts no trace of its own.
    sampler = instrument.InsideOurSpans(sampling._get_from_env_or_default()) if wanted else None
    provider = TracerProvider(resource=resource, sampler=sampler)
    for name in names:
        if name == "console":  # for a person reading along: each span as it ends
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(_entry_point("traces", name)()))
    trace.set_tracer_provider(provider)
    if wanted:
        instrument.wire(provider)
    return provider.shutdown


def _metric_readers(names: list[str], shutdowns: list[Callable[[], object]]) -> list[MetricReader]:
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    readers: list[MetricReader] = []
    scraped: list[tuple[str, int]] = []
    port = os.environ.get(PROMETHEUS_PORT_ENV)
    if port:
        scraped.append((os.environ.get(PROMETHEUS_HOST_ENV, "127.0.0.1"), int(port)))
    for name in names:
        if name == "prometheus":
            host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
            scraped.append((host, int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))))
        elif name == "console":
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
        else:
            readers.append(PeriodicExportingMetricReader(_entry_point("metrics", name)()))
    if scraped:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
        from prometheus_client import start_http_server  # noqa: PLC0415

        for host, number in dict.fromkeys(scraped):
            server, _thread = start_http_server(number, addr=host)
            shutdowns.append(server.shutdown)
        readers.append(PrometheusMetricReader())
    return readers


def configure_telemetry() -> TelemetrySetup:
    """Install exporters as the environment asks; a name it cannot honour is a ConfigError."""
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

    traces, wanted_metrics = exporter_names("traces"), exporter_names("metrics")
    _warn_about_logs()
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE_NAME_DEFAULT)}
    )
    shutdowns: list[Callable[[], object]] = []
    if traces:
        shutdowns.append(_install_traces(traces, resource))
    readers = _metric_readers(wanted_metrics, shutdowns)
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415

        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        shutdowns.append(meter_provider.shutdown)

    def shutdown() -> None:
        for stop in shutdowns:
            stop()

    return TelemetrySetup(metrics=bool(readers), shutdown=shutdown)
