"""The bridge's configuration: one TOML file, read into frozen pydantic models and checked whole.

Every key is declared once, as a field of a model (:mod:`bridge.config.model` for the core,
each adapter's :class:`~bridge.adapters.sources.SourceSettings` for its broker's keys) holding its
type, range, default and documentation. The same declaration reads the file, rejects what is wrong,
writes the reference (:func:`reference_markdown`, published as ``docs/configuration.md``;
regenerate it with ``python -m bridge.config``) and the JSON Schema editors validate the file
with (``fencebridge config schema``), so none of them can drift from what is enforced.

Errors are :class:`~bridge.errors.ConfigError` naming the file, the dotted key and the problem::

    bridge.toml: subscriptions.refunds.decode.tenant_id: expected 'attribute:NAME',
    'body:/json/pointer' or 'value:TEXT', got 'tenant'

Every problem in the file is reported at once, one per line; unknown keys are errors (a typo
must not silently fall back to a default) with the nearest key suggested, and secrets never
come from the file: a ``database_url`` key anywhere is refused in favour of the environment.

pydantic (v2) validates, chosen over msgspec by measuring both on these tables: msgspec stops
at the first problem (one of five in a sample file; reporting them all would mean keeping a
framework of our own), pydantic reports all five with their location and kind. It costs more
to start: about 75 ms to import and 20 ms to build the models, against msgspec's 18 ms and
0.1 ms, once per process, beside the broker SDKs' 200-700 ms.
"""

from __future__ import annotations

from bridge.config.loading import load_config, parse_config, read_destination
from bridge.config.model import (
    ACK_MODE_DEFAULT,
    BACKOFF_INITIAL_SECONDS_DEFAULT,
    BACKOFF_MAX_SECONDS_DEFAULT,
    HEALTH_HOST_DEFAULT,
    HEALTH_PORT_DEFAULT,
    LEASE_SECONDS_DEFAULT,
    MAX_ATTEMPTS_CLASS_D,
    MAX_ATTEMPTS_DEFAULT,
    MAX_BODY_BYTES_DEFAULT,
    POLL_INTERVAL_SECONDS_DEFAULT,
    PREFETCH_DEFAULT,
    SHUTDOWN_DEADLINE_SECONDS_DEFAULT,
    SWEEP_INTERVAL_SECONDS_DEFAULT,
    WORKER_THREADS_DEFAULT,
    AckMode,
    BridgeConfig,
    BridgeSettings,
    DecodeConfig,
    DestinationConfig,
    JobConfig,
    RetentionConfig,
    SubscriptionConfig,
    SubscriptionMode,
    default_worker_id,
)
from bridge.config.reference import reference_markdown
from bridge.config.schema import config_schema

__all__ = [
    "ACK_MODE_DEFAULT",
    "BACKOFF_INITIAL_SECONDS_DEFAULT",
    "BACKOFF_MAX_SECONDS_DEFAULT",
    "HEALTH_HOST_DEFAULT",
    "HEALTH_PORT_DEFAULT",
    "LEASE_SECONDS_DEFAULT",
    "MAX_ATTEMPTS_CLASS_D",
    "MAX_ATTEMPTS_DEFAULT",
    "MAX_BODY_BYTES_DEFAULT",
    "POLL_INTERVAL_SECONDS_DEFAULT",
    "PREFETCH_DEFAULT",
    "SHUTDOWN_DEADLINE_SECONDS_DEFAULT",
    "SWEEP_INTERVAL_SECONDS_DEFAULT",
    "WORKER_THREADS_DEFAULT",
    "AckMode",
    "BridgeConfig",
    "BridgeSettings",
    "DecodeConfig",
    "DestinationConfig",
    "JobConfig",
    "RetentionConfig",
    "SubscriptionConfig",
    "SubscriptionMode",
    "config_schema",
    "default_worker_id",
    "load_config",
    "parse_config",
    "read_destination",
    "reference_markdown",
]
