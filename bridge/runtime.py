"""The running bridge: consumers, the worker pool, the sweeper and the health endpoint.

Start order: check the schema version, import every handler (a typo fails here, with the job
type and the import path), start the pool and the sweeper, then the consumers, then the health
endpoint. Stop order is the reverse of the work's flow: consumers stop receiving (whatever they
already received is written and acknowledged), the pool releases claims that never started and
gives running handlers until the deadline, then the sweeper and the endpoint stop.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from datetime import timedelta
from functools import partial
from types import FrameType

from bridge import sources
from bridge.config import BridgeConfig
from bridge.decode import decode
from bridge.errors import ConfigError
from bridge.events import WorkEvents
from bridge.handlers import Handler, RetryPolicy
from bridge.health import HealthServer
from bridge.identity import IdentityHasher
from bridge.inbox import Inbox
from bridge.migrate import require_current
from bridge.registry import Registry
from bridge.store import PostgresStore
from bridge.sweeper import Sweeper
from bridge.telemetry import Telemetry, names
from bridge.worker import StopReport, WorkerPool

log = logging.getLogger(__name__)

MESSAGING_SYSTEMS = {"sqs": names.SYSTEM_SQS, "pubsub": names.SYSTEM_PUBSUB}


def resolve_handler(path: str, *, job_type: str) -> Handler:
    """Import ``module.path:attribute``; a class is instantiated without arguments."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
        target = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"jobs.{job_type}.handler: cannot import {path!r}: {exc}") from exc
    try:
        handler = target() if isinstance(target, type) else target
    except TypeError as exc:  # abstract methods left unimplemented, or required arguments
        raise ConfigError(f"jobs.{job_type}.handler: cannot create {path!r}: {exc}") from exc
    if not isinstance(handler, Handler):
        raise ConfigError(
            f"jobs.{job_type}.handler: {path!r} is not a fencebridge handler "
            "(extend one of the target-class bases in bridge.handlers)"
        )
    return handler


def build_registry(config: BridgeConfig, handlers: dict[str, Handler] | None = None) -> Registry:
    """Job types from the configuration; ``handlers`` may supply instances instead of imports."""
    registry = Registry()
    for name, job in config.jobs.items():
        handler = (handlers or {}).get(name) or resolve_handler(job.handler, job_type=name)
        try:
            registry.register(
                name,
                handler,
                retry=RetryPolicy(
                    max_attempts=job.max_attempts,
                    backoff_initial=timedelta(seconds=job.backoff_initial_seconds),
                    backoff_max=timedelta(seconds=job.backoff_max_seconds),
                ),
                lease=timedelta(seconds=job.lease_seconds),
                declared_class=job.target_class,
            )
        except ConfigError as exc:
            raise ConfigError(f"{config.file}: jobs.{name}: {exc}") from exc
    return registry


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        store: PostgresStore,
        hasher: IdentityHasher,
        *,
        registry: Registry | None = None,
        events: WorkEvents | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        settings = config.bridge
        self.telemetry = telemetry or Telemetry(hasher)
        self.config = config
        self.store = store
        self.registry = registry or build_registry(config)
        self.pool = WorkerPool(
            store,
            self.registry,
            hasher,
            worker_id=settings.worker_id,
            threads=settings.worker_threads,
            claim_batch=settings.claim_batch,
            poll_interval=settings.poll_interval_seconds,
            events=events,
            telemetry=self.telemetry,
        )
        self.sweeper = Sweeper(store, interval=settings.sweep_interval_seconds)
        self.consumers: list[sources.Consumer] = []
        for name, sub in config.subscriptions.items():
            inbox = Inbox(
                store,
                partial(decode, config.decode_rules(name)),
                hand_off=self.pool.hand_off,
                system=MESSAGING_SYSTEMS.get(sub.source.value, sub.source.value),
                telemetry=self.telemetry,
            )
            self.consumers.append(sources.factory(sub.source.value)(sub, inbox, store))
        self.health: HealthServer | None = None
        if settings.health_port:
            checks = {"database": self._database_ready}
            for consumer in self.consumers:
                checks[f"subscription:{consumer.subscription}"] = consumer.status
            self.health = HealthServer(settings.health_host, settings.health_port, checks)
        self._stopped = threading.Event()

    def _database_ready(self) -> tuple[bool, str]:
        return (True, "ok") if self.pool.healthy else (False, "claims are failing")

    def start(self) -> None:
        self.pool.start()
        self.sweeper.start()
        for consumer in self.consumers:
            consumer.start()
        if self.health is not None:
            self.health.start()
        log.info(
            "bridge started: %d subscription(s), %d job type(s), %d worker thread(s)",
            len(self.consumers),
            len(self.registry.job_types),
            self.config.bridge.worker_threads,
        )

    def stop(self, deadline: float | None = None) -> StopReport:
        budget = self.config.bridge.shutdown_deadline_seconds if deadline is None else deadline
        for consumer in self.consumers:
            consumer.stop(budget)
        report = self.pool.stop(budget)
        self.sweeper.stop()
        if self.health is not None:
            self.health.stop()
        self._stopped.set()
        log.info("bridge stopped: %d released, %d abandoned", report.released, report.abandoned)
        return report

    def run_until_signalled(self) -> StopReport:
        """Start, wait for SIGTERM or SIGINT, drain within the deadline, return."""
        stop = threading.Event()

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: draining", signal.Signals(signum).name)
            stop.set()

        previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            stop.wait()
            return self.stop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def open_bridge(config: BridgeConfig, database_url: str, hasher: IdentityHasher) -> Bridge:
    """Connect, refuse a schema this code does not match, import handlers: ready to start."""
    pool_size = config.bridge.worker_threads + 2 * len(config.subscriptions) + 4
    store = PostgresStore.connect(database_url, max_size=pool_size)
    try:
        with store.pool.connection() as conn:
            require_current(conn)
        return Bridge(config, store, hasher)
    except BaseException:
        store.close()
        raise
