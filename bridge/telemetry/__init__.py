"""OpenTelemetry traces and metrics, and decision logs, for fencebridge.

Attribute and metric names live in :mod:`bridge.telemetry.names`; exporters are wired from the
standard ``OTEL_*`` environment by :func:`~bridge.telemetry.setup.configure_telemetry`;
:class:`~bridge.telemetry.recorder.Telemetry` records what the inbox and the worker tier do.
"""

from bridge.telemetry.recorder import Telemetry

__all__ = ["Telemetry"]
