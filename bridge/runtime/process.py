"""The running bridge: consumers, the worker pool, the sweeper and the health endpoint.

Start: check the schema version, build every handler
(:func:`bridge.executors.registry.build_job`, which ``fencebridge check`` runs too: a typo or a
handler that cannot be built fails here, with the job type and the reason), compare the identity key
with the one the database was written under (:func:`bridge.keyring.attach`: another key refuses the
start), then start the stages. The stages are declared once, in the order the work flows
(:attr:`Bridge.stages`): consumers, the worker pool, the outbox relay, the sweeper, the health
endpoint. They start last to first and stop first to last: consumers stop receiving (whatever they
already received is written and acknowledged), the pool releases claims that never started and
gives running handlers until the deadline, the relay sends what the pool's last runs committed,
then the sweeper and the endpoint stop.

One deadline covers the whole stop: every consumer is told to stop at once and each gets what
is left of it, the pool gets what the consumers left, the rest what the pool left. Every
long-lived thread of the core is a supervised service (:mod:`bridge.service`); ``/readyz`` and
``/healthz`` are built from all of them and from the consumers' own status.
"""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from functools import partial
from types import FrameType

from bridge.adapters import sources
from bridge.config import AckMode, BridgeConfig
from bridge.events import WorkEvents
from bridge.executors.registry import Registry
from bridge.executors.registry import build_registry as build_registry  # noqa: PLC0414  (re-exported)
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.ingest.shadow import ShadowWrites
from bridge.keyring import attach
from bridge.outbox.relay import Relay
from bridge.runtime.consumers import Consumers
from bridge.runtime.health import HealthServer
from bridge.runtime.sweeper import Sweeper
from bridge.runtime.worker import CLAIMERS_DEFAULT, StopReport, WorkerPool
from bridge.service import Deadline, Limits, Part, Service, Stages
from bridge.store import PostgresStore
from bridge.store.claims import ClaimPolicy
from bridge.store.migrate import require_current
from bridge.telemetry import Telemetry

log = logging.getLogger(__name__)

#: threads of the core that use a connection besides the workers: the first claimer (which
#: keeps one, and writes the completer's batches with its claims), heartbeater, sweeper,
#: database gauges; each further claimer (:data:`~bridge.runtime.worker.CLAIMERS_DEFAULT`) takes one
#: more
CORE_CONNECTIONS = 4
#: spare connections: a command-line check, a connection being replaced after an error
POOL_MARGIN = 2


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
        limits: Limits | None = None,
        record_first_key: bool = True,
    ) -> None:
        settings = config.bridge
        #: False for ``fencebridge run``: a database with no key recorded refuses the start
        #: (``fencebridge identity init`` records it); the demo and embedding programs record it
        self.record_first_key = record_first_key
        self.telemetry = telemetry or Telemetry(hasher)
        self.config = config
        self.store = store
        self.hasher = hasher
        self.registry = registry or build_registry(config)
        self.pool = WorkerPool(
            store,
            self.registry,
            hasher,
            worker_id=settings.worker_id,
            threads=settings.worker_threads,
            claim_batch=settings.claim_batch,
            prefetch=settings.prefetch,
            poll_interval=settings.poll_interval_seconds,
            events=events,
            telemetry=self.telemetry,
            limits=limits,
        )
        self.sweeper = Sweeper(
            store.settle,
            interval=settings.sweep_interval_seconds,
            limits=limits,
            on_restart=self.telemetry.thread_restarted,
        )
        self.relay: Relay | None = None
        if config.outbox:
            self.relay = Relay(
                store.outbox,
                config.outbox,
                owner=settings.worker_id,
                limits=limits,
                on_restart=self.telemetry.thread_restarted,
            )
        consumers: list[sources.Consumer] = []
        for name, sub in config.subscriptions.items():
            # A shadow subscription writes to the shadow record, which no claim reads, and
            # hands nothing to the pool: fixed here, at construction, for the process's life.
            inbox = Inbox(
                ShadowWrites(store.inbox) if sub.shadow else store.inbox,
                partial(decode, config.decode_rules(name)),
                pool=None if sub.shadow else self.pool,
                system=sources.adapter(sub.source).messaging_system,
                telemetry=self.telemetry,
                limits=limits,
            )
            consumers.append(sources.adapter(sub.source).open(sub, inbox, store.inbox))
        self.consumers = Consumers(consumers)
        self.health: HealthServer | None = None
        if settings.health_port:
            checks = {"database": self._database_ready}
            for consumer in self.consumers.members:
                checks[f"subscription:{consumer.subscription}"] = consumer.status
            self.health = HealthServer(
                settings.health_host,
                settings.health_port,
                checks,
                services=self.services,
                limits=limits,
                on_restart=self.telemetry.thread_restarted,
            )
        # the order the work flows through them: started last to first, stopped first to last
        stages: list[tuple[str, Part]] = [("consumers", self.consumers), ("pool", self.pool)]
        if self.relay is not None:
            stages.append(("relay", self.relay))
        stages.append(("sweeper", self.sweeper))
        if self.health is not None:
            stages.append(("health", self.health))
        self.stages = Stages(stages)
        self._stopped = threading.Event()

    def services(self) -> list[Service]:
        """Every supervised service of the core (the health endpoint reports itself)."""
        found = [*self.pool.services(), self.sweeper.service]
        if self.relay is not None:
            found.extend(self.relay.services())
        found.extend(self.consumers.services())
        if self.telemetry.gauges is not None:
            found.append(self.telemetry.gauges)
        return found

    def _database_ready(self) -> tuple[bool, str]:
        ok, why = self.pool.claimer.status().readiness
        return (True, "ok") if ok else (False, f"claims are failing: {why}")

    def start(self) -> None:
        # Before anything hashes or claims: a key other than the database's refuses the start.
        attach(
            self.store.keys, self.hasher, used_by="fencebridge run", first_use=self.record_first_key
        )
        self.stages.start()
        log.info(
            "bridge started: %d subscription(s), %d job type(s), %d worker thread(s)",
            len(self.consumers.members),
            len(self.registry.job_types),
            self.config.bridge.worker_threads,
        )
        for name, sub in self.config.subscriptions.items():
            if sub.shadow:
                log.info("subscription %s is a shadow: recorded for comparison, never run", name)

    def stop(self, deadline: float | Deadline | None = None) -> StopReport:
        """Drain within one deadline: consumers (all at once), then the pool, then the rest."""
        until = Deadline.of(
            self.config.bridge.shutdown_deadline_seconds if deadline is None else deadline
        )
        answers = self.stages.stop(until)
        report = answers.get("pool")
        if not isinstance(report, StopReport):  # the pool's stop raised: it was logged
            report = StopReport(released=0, finished=0, abandoned=0)
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


def pool_size(config: BridgeConfig) -> int:
    """Connections for every thread that may hold one at once, plus a margin.

    Each worker, the core's threads (:data:`CORE_CONNECTIONS`), every consumer thread of every
    subscription (its adapter's settings say how many: ``receivers()``), and for
    ``after_outcome`` its holder thread. Fewer connections than threads turn a busy moment into
    pool timeouts: failed ingests, missed heartbeats.
    """
    consumers = sum(
        sub.settings.receivers() + (1 if sub.ack_mode is AckMode.AFTER_OUTCOME else 0)
        for sub in config.subscriptions.values()
    )
    claimers = CLAIMERS_DEFAULT - 1  # the first is in CORE_CONNECTIONS
    relays = len(config.outbox)  # one relay loop per outbox destination
    return (
        config.bridge.worker_threads
        + CORE_CONNECTIONS
        + claimers
        + consumers
        + relays
        + POOL_MARGIN
    )


def open_bridge(
    config: BridgeConfig,
    database_url: str,
    hasher: IdentityHasher,
    *,
    telemetry: Telemetry | None = None,
    limits: Limits | None = None,
    record_first_key: bool = True,
) -> Bridge:
    """Connect, refuse a schema this code does not match, import handlers: ready to start."""
    store = PostgresStore.connect(
        database_url,
        max_size=pool_size(config),
        timeouts=config.bridge.session_timeouts(),
        attempt_history=config.bridge.attempt_history,
        priority_aging=timedelta(seconds=config.bridge.priority_aging_seconds),
        generic_plans=True,
        policy=ClaimPolicy(
            concurrency=config.concurrency_limits(),
            rates=config.token_rates(),
            fairness=config.bridge.tenant_weights if config.bridge.tenant_fairness else None,
        ),
    )
    try:
        with store.connection("schema check") as conn:
            require_current(conn)
        return Bridge(
            config,
            store,
            hasher,
            telemetry=telemetry,
            limits=limits,
            record_first_key=record_first_key,
        )
    except BaseException:
        store.close()
        raise
