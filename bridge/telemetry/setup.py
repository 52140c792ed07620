"""Wiring OpenTelemetry exporters from the standard environment, and nothing by default.

* Traces and metrics go to OTLP (HTTP) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
  signal-specific ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT``) is set;
  every other ``OTEL_*`` variable (headers, timeouts, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SDK_DISABLED``) is read by the SDK itself.
* Metrics are also served for Prometheus to scrape when ``FENCEBRIDGE_PROMETHEUS_PORT`` is set
  (address ``FENCEBRIDGE_PROMETHEUS_HOST``, default 127.0.0.1).
* With none of these set, nothing is exported and the API stays a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import MetricReader

PROMETHEUS_PORT_ENV = "FENCEBRIDGE_PROMETHEUS_PORT"
PROMETHEUS_HOST_ENV = "FENCEBRIDGE_PROMETHEUS_HOST"
SERVICE_NAME_DEFAULT = "fencebridge"


def _wanted(signal: str) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get(f"OTEL_{signal}_EXPORTER", "").lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


@dataclass(frozen=True)
class TelemetrySetup:
    #: metrics are exported somewhere, so database gauges are worth refreshing
    metrics: bool
    #: flushes and stops the exporters
    shutdown: Callable[[], None]


def configure_telemetry() -> TelemetrySetup:
    """Install exporters as the environment asks."""
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE_NAME_DEFAULT)}
    )
    shutdowns: list[Callable[[], object]] = []
    if _wanted("TRACES"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(tracer_provider)
        shutdowns.append(tracer_provider.shutdown)

    readers: list[MetricReader] = []
    if _wanted("METRICS"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            PeriodicExportingMetricReader,
        )

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    port = os.environ.get(PROMETHEUS_PORT_ENV)
    if port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
        from prometheus_client import start_http_server  # noqa: PLC0415

        server, _thread = start_http_server(
            int(port), addr=os.environ.get(PROMETHEUS_HOST_ENV, "127.0.0.1")
        )
        shutdowns.append(server.shutdown)
        readers.append(PrometheusMetricReader())
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415

        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        shutdowns.append(meter_provider.shutdown)

    def shutdown() -> None:
        for stop in shutdowns:
            stop()

    return TelemetrySetup(metrics=bool(readers), shutdown=shutdown)
