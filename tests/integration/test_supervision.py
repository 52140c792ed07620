"""Supervised threads against a PostgreSQL that really fails: refused grants, a read-only server.

Faults are the database's own: ``REVOKE`` on the role the bridge connects as (SQLSTATE 42501)
and ``default_transaction_read_only`` with the bridge's connections terminated, so they come
back read-only as after a failover (25006). The claimer, heartbeater and sweeper must stay
alive through them, say so on ``/readyz`` (and past the limit on ``/healthz``), count their
restarts, and pick up again once the fault clears. Waits poll with a deadline; the backoff's
waits are injected where a test drives thousands of failures.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from psycopg import sql

from bridge.config import BridgeConfig, parse_config
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, Success
from bridge.identity import IdentityHasher
from bridge.runtime.process import Bridge, build_registry
from bridge.runtime.worker import WorkerPool
from bridge.service import Backoff, Deadline, Limits, Service
from bridge.store import PostgresStore
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from consumers.sqs.source import SqsSettings
from tests.support.bridge_process import Job, SqsBridgeConfig, free_port
from tests.support.deliveries import for_job
from tests.support.roles import Roles, apply_roles, drop_roles
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

Db = psycopg.Connection[Any]

HASHER = IdentityHasher(b"supervision-tests-identity-secret")
LEASE_SECONDS = 20.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    """moto's server, and dummy credentials for the clients the bridge builds itself."""
    with sqs_server() as server, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        yield server


@pytest.fixture
def roles(db_url: str) -> Iterator[Roles]:
    prefix = f"fbsup_{secrets.token_hex(4)}"
    try:
        apply_roles(db_url, prefix)
        yield Roles(prefix, db_url)
    finally:
        drop_roles(db_url, prefix)


class Quick(ConditionalWriteHandler):
    def handle(self, ctx: Context) -> Success:
        return Success("done")


class Progressing(ConditionalWriteHandler):
    """Reports progress until released, so its lease is heartbeated all along."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.fences: list[int] = []

    def handle(self, ctx: Context) -> Success:
        self.fences.append(ctx.fence)
        self.started.set()
        while not self.release.wait(0.05):
            ctx.progress()
        return Success("done")


def grant(db: Db, role: str, *, revoke: bool) -> None:
    statement = (
        "REVOKE UPDATE ON work_item FROM {}" if revoke else "GRANT UPDATE ON work_item TO {}"
    )
    db.execute(sql.SQL(statement).format(sql.Identifier(role)))


def terminate_bridge_connections(db: Db) -> None:
    """Cut every connection the bridge's pool holds; it reconnects with the current settings."""
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'fencebridge'"
        "   AND pid <> pg_backend_pid()"
    )


def read_only(db: Db, on: bool) -> None:
    name = db.info.dbname
    if on:
        db.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                sql.Identifier(name)
            )
        )
    else:
        db.execute(
            sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(
                sql.Identifier(name)
            )
        )
    terminate_bridge_connections(db)


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def bridge_config(moto: SqsServer, job: str, **settings: Any) -> BridgeConfig:
    cfg = SqsBridgeConfig(
        queue_url=moto.create_queue("supervision"),
        endpoint_url=moto.endpoint,
        jobs={job: Job("tests.support.handlers:SteadyProgress", "B", LEASE_SECONDS)},
        health_port=free_port(),
        poll_interval_seconds=0.05,
        sweep_interval_seconds=0.2,
        **settings,
    )
    return parse_config(cfg.toml(), file="supervision.toml")


def states(db: Db) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {s: int(c) for s, c in rows}


# -- the claimer ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_claimer_survives_ten_thousand_refused_claims_and_recovers(
    roles: Roles, db: Db, store: PostgresStore
) -> None:
    registry = Registry()
    registry.register("quick", Quick())
    waits: list[float] = []
    grant(db, roles.bridge, revoke=True)
    bridge_store = PostgresStore.connect(roles.url_as(roles.bridge), max_size=6)
    pool = WorkerPool(
        bridge_store,
        registry,
        HASHER,
        threads=2,
        poll_interval=0.05,
        backoff=Backoff(initial=0.1, cap=5.0, sleep=waits.append),
        limits=Limits(failing_seconds=3600, restarts=10**6),
    )
    pool.start()
    try:
        eventually(lambda: len(waits) >= 10_000, "10,000 refused claims", timeout=600)
        status = pool.claimer.status()
        assert not status.ready
        assert "SQLSTATE 42501" in status.reason
        assert status.failures >= 10_000
        assert status.live
        assert pool.claimer.thread.is_alive(), "refused ten thousand times, still running"
        assert all(0 <= w <= 5.0 for w in waits)
        assert not pool.healthy

        grant(db, roles.bridge, revoke=False)
        store.inbox.ingest([for_job(registry, "quick", f"op-{i}") for i in range(20)])
        eventually(lambda: states(db) == {"succeeded": 20}, "claims resume once granted")
        assert pool.healthy
        assert pool.claimer.status().failures == 0
    finally:
        pool.stop(deadline=10)
        bridge_store.close()


# -- a read-only database ------------------------------------------------------------------------


@pytest.mark.slow
def test_heartbeater_claimer_and_sweeper_survive_a_read_only_database(
    moto: SqsServer, db_url: str, db: Db, store: PostgresStore
) -> None:
    config = bridge_config(moto, "steady")
    handler = Progressing()
    registry = build_registry(config, handlers={"steady": handler})
    bridge_store = PostgresStore.connect(db_url, max_size=12)
    limits = Limits(failing_seconds=3600, restarts=10**6)
    bridge = Bridge(config, bridge_store, HASHER, registry=registry, limits=limits)
    port = config.bridge.health_port
    store.inbox.ingest([for_job(registry, "steady", "long", tenant="t1")])
    bridge.start()
    try:
        assert handler.started.wait(60)
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready before the fault")
        renewed_before = lease_expires_at(db, "long")
        eventually(lambda: lease_expires_at(db, "long") > renewed_before, "a first renewal")

        read_only(db, True)

        def failing_read_only() -> bool:
            status, body = probe(port, "/readyz")
            services = body.get("services", {})
            return status == 503 and all(
                "25006" in services.get(name, "") for name in ("claimer", "heartbeater", "sweeper")
            )

        eventually(failing_read_only, "claimer, heartbeater and sweeper refused as read-only")
        _, body = probe(port, "/readyz")
        assert body["checks"]["database"].startswith("claims are failing: failing for")
        assert probe(port, "/healthz") == (200, {"status": "ok"}), "not ready, still alive"
        for service in bridge.services():
            assert service.status().live, service.name
        assert bridge.pool.heartbeater.service.thread.is_alive()
        assert bridge.sweeper.service.thread.is_alive()
        assert bridge.pool.claimer.status().failures > 0
        stuck_at = lease_expires_at(db, "long")

        read_only(db, False)
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready again once writable")
        eventually(lambda: lease_expires_at(db, "long") > stuck_at, "renewals resume")
        handler.release.set()
        eventually(lambda: states(db) == {"succeeded": 1}, "the long run completes")
        assert handler.fences == [1], "its lease was never lost through the fault"
        assert bridge.pool.counts["lease_lost"] == 0
    finally:
        read_only(db, False)
        handler.release.set()
        bridge.stop(deadline=10)
        bridge_store.close()


def lease_expires_at(db: Db, operation: str) -> Any:
    found = db.execute(
        "SELECT lease_expires_at FROM work_item WHERE operation_id = %s", (operation,)
    ).fetchone()
    assert found is not None
    return found[0]


# -- handlers that never return ------------------------------------------------------------------


class Hangs(ConditionalWriteHandler):
    """Never reports progress and returns only once released: a handler stuck in a call."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def handle(self, ctx: Context) -> Success:
        self.release.wait(300)
        return Success("late")


def stuck_reason(port: int) -> str:
    return str(probe(port, "/readyz")[1].get("services", {}).get("handlers", ""))


@pytest.mark.slow
def test_handlers_stuck_past_their_lease_fail_readiness_and_every_thread_stuck_liveness(
    moto: SqsServer, db_url: str, db: Db, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Three worker threads, leases of one second. A handler that never returns holds its
    thread: once its run is more than one lease past its lease, /readyz fails naming it, while
    a handler that reports progress all along runs past as many leases unnamed. /healthz stays
    up while a thread is free, and fails once all three are held; both recover when the
    handlers return."""
    cfg = SqsBridgeConfig(
        queue_url=moto.create_queue("stuck"),
        endpoint_url=moto.endpoint,
        jobs={
            "steady": Job("tests.support.handlers:SteadyProgress", "B", 1.0),
            "hang": Job("tests.support.handlers:SteadyProgress", "B", 1.0, max_attempts=1),
        },
        worker_threads=3,
        poll_interval_seconds=0.05,
        sweep_interval_seconds=0.2,
    )
    config = parse_config(cfg.toml(), file="stuck.toml")
    steady, hangs = Progressing(), Hangs()
    registry = build_registry(config, handlers={"steady": steady, "hang": hangs})
    bridge_store = PostgresStore.connect(db_url, max_size=12)
    bridge = Bridge(config, bridge_store, HASHER, registry=registry)
    port = config.bridge.health_port
    store.inbox.ingest([for_job(registry, "steady", "slow")])
    caplog.set_level(logging.ERROR, logger="bridge.runtime.heartbeat")
    bridge.start()
    try:
        assert steady.started.wait(60)
        store.inbox.ingest([for_job(registry, "hang", "hang-1")])
        eventually(lambda: stuck_reason(port).startswith("1 of 3"), "one thread held")
        assert "job type hang" in stuck_reason(port)
        assert probe(port, "/readyz")[0] == 503
        assert probe(port, "/healthz") == (200, {"status": "ok"}), "two threads are free"
        eventually(lambda: "job type hang" in caplog.text, "the stuck run logged")
        assert "hang-1" not in caplog.text
        # The steady handler has run past more than two of its leases, renewing them.
        eventually(
            lambda: bool(
                db.execute(
                    "SELECT lease_expires_at - claimed_at > interval '3 seconds'"
                    "  FROM work_item WHERE operation_id = 'slow'"
                ).fetchone()
                == (True,)
            ),
            "the steady run's lease renewed past three leases",
        )
        assert stuck_reason(port).startswith("1 of 3"), "the steady run is not stuck"
        steady.release.set()
        eventually(lambda: states(db).get("succeeded") == 1, "the steady run completes")

        store.inbox.ingest([for_job(registry, "hang", f"hang-{i}") for i in (2, 3)])
        eventually(lambda: probe(port, "/healthz")[0] == 503, "every thread held")
        _, body = probe(port, "/healthz")
        assert body["services"]["handlers"].startswith("3 of 3"), body

        hangs.release.set()
        eventually(lambda: probe(port, "/healthz") == (200, {"status": "ok"}), "alive again")
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready again")
    finally:
        steady.release.set()
        hangs.release.set()
        bridge.stop(deadline=10)
        bridge_store.close()


# -- a revoked grant: past the limit, /healthz ---------------------------------------------------


def test_a_revoked_grant_fails_liveness_past_the_limit_counts_restarts_and_recovers(
    moto: SqsServer, roles: Roles, db: Db
) -> None:
    config = bridge_config(moto, "quick")
    registry = build_registry(config, handlers={"quick": Quick()})
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(HASHER, meter_provider=meters)
    bridge_store = PostgresStore.connect(roles.url_as(roles.bridge), max_size=12)
    bridge = Bridge(
        config,
        bridge_store,
        HASHER,
        registry=registry,
        telemetry=telemetry,
        limits=Limits(failing_seconds=3600, restarts=3),
    )
    port = config.bridge.health_port
    bridge.start()
    try:
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready before the fault")
        assert probe(port, "/healthz") == (200, {"status": "ok"})

        grant(db, roles.bridge, revoke=True)
        # Every service that reads the work table fails; whichever passes its restart limit
        # first fails liveness (the sweeper's shorter first backoffs often win), and the
        # claimer joins it once it has passed its own.
        eventually(
            lambda: (
                "SQLSTATE 42501"
                in probe(port, "/healthz")[1].get("services", {}).get("claimer", "")
            ),
            "liveness fails past the claimer's limit",
        )
        status, body = probe(port, "/healthz")
        assert (status, body["status"]) == (503, "failing")
        eventually(
            lambda: "42501" in probe(port, "/readyz")[1].get("services", {}).get("sweeper", ""),
            "the sweeper refused too",
        )
        status, ready = probe(port, "/readyz")
        assert status == 503
        assert "42501" in ready["services"]["claimer"]
        assert bridge.pool.claimer.status().restarts >= 3

        grant(db, roles.bridge, revoke=False)
        eventually(lambda: probe(port, "/healthz") == (200, {"status": "ok"}), "alive again")
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready again")
        bridge_store.inbox.ingest([for_job(registry, "quick", "after")])
        eventually(lambda: states(db) == {"succeeded": 1}, "work runs again")
    finally:
        grant(db, roles.bridge, revoke=False)
        bridge.stop(deadline=10)
        bridge_store.close()

    restarts = restart_points(reader)
    assert restarts.get("claimer", 0) >= 3
    assert restarts.get("sweeper", 0) >= 1
    meters.shutdown()


@pytest.mark.slow
def test_a_receive_loop_that_cannot_write_fails_liveness_past_the_limit_and_recovers(
    moto: SqsServer, roles: Roles, db: Db
) -> None:
    config = bridge_config(moto, "quick")
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    bridge_store = PostgresStore.connect(roles.url_as(roles.bridge), max_size=12)
    bridge = Bridge(
        config,
        bridge_store,
        HASHER,
        registry=build_registry(config, handlers={"quick": Quick()}),
        telemetry=Telemetry(HASHER, meter_provider=meters),
        limits=Limits(failing_seconds=3600, restarts=3),
    )
    port = config.bridge.health_port
    sub = config.subscriptions["orders"]
    bridge.start()
    try:
        eventually(lambda: probe(port, "/readyz")[0] == 200, "ready before the fault")
        db.execute(
            sql.SQL("REVOKE INSERT ON work_item FROM {}").format(sql.Identifier(roles.bridge))
        )
        moto.client().send_message(
            QueueUrl=SqsSettings.of(sub).queue_url,
            MessageBody="{}",
            MessageAttributes={
                name: {"DataType": "String", "StringValue": value}
                for name, value in (
                    ("tenant_id", "t1"),
                    ("operation_id", "op-1"),
                    ("job_type", "quick"),
                )
            },
        )
        eventually(lambda: probe(port, "/healthz")[0] == 503, "liveness fails past the limit")
        _, body = probe(port, "/healthz")
        receiver = body["services"]["sqs:orders:receive-0"]
        assert "SQLSTATE 42501" in receiver
        assert "orders" in probe(port, "/readyz")[1]["checks"]["subscription:orders"]

        db.execute(sql.SQL("GRANT INSERT ON work_item TO {}").format(sql.Identifier(roles.bridge)))
        eventually(lambda: probe(port, "/healthz") == (200, {"status": "ok"}), "alive again")
        eventually(lambda: states(db) == {"succeeded": 1}, "the message comes back and runs")
    finally:
        db.execute(sql.SQL("GRANT INSERT ON work_item TO {}").format(sql.Identifier(roles.bridge)))
        bridge.stop(deadline=10)
        bridge_store.close()
    assert restart_points(reader).get("sqs_receiver", 0) >= 3
    meters.shutdown()


def restart_points(reader: InMemoryMetricReader) -> dict[str, float]:
    """The restart counter's value by its ``service`` label, the only label it may carry."""
    found: dict[str, float] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != n.METRIC_THREAD_RESTARTS:
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    assert set(attributes) == {n.LABEL_SERVICE}
                    found[str(attributes[n.LABEL_SERVICE])] = float(getattr(point, "value", 0))
    return found


# -- one shutdown deadline -----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0.0

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class SlowToStop:
    """A consumer whose stop takes all the time it is given (by the test's clock)."""

    def __init__(self, name: str, clock: FakeClock, everyone: int, state: dict[str, Any]) -> None:
        self.subscription = name
        self._clock = clock
        self._everyone = everyone
        self._state = state
        self.given: float | None = None

    def start(self) -> None:
        """Nothing to receive."""

    def status(self) -> tuple[bool, str]:
        return True, "ok"

    def services(self) -> list[Service]:
        return []

    def stop(self, deadline: float = 30.0) -> None:
        self.given = deadline
        lock: threading.Lock = self._state["lock"]
        all_in: threading.Event = self._state["all_in"]
        with lock:
            self._state["stopping"] += 1
            if self._state["stopping"] == self._everyone:
                all_in.set()
        all_in.wait(5)  # real seconds: only for the stops that do not run together
        self._clock.advance(deadline)


def test_every_consumer_and_the_pool_share_one_shutdown_deadline(
    moto: SqsServer, db_url: str, store: PostgresStore
) -> None:
    config = bridge_config(moto, "steady", shutdown_deadline_seconds=10.0)
    handler = Progressing()
    registry = build_registry(config, handlers={"steady": handler})
    bridge_store = PostgresStore.connect(db_url, max_size=12)
    bridge = Bridge(config, bridge_store, HASHER, registry=registry)
    clock = FakeClock()
    state: dict[str, Any] = {"lock": threading.Lock(), "all_in": threading.Event(), "stopping": 0}
    consumers = [SlowToStop(f"sub-{i}", clock, 3, state) for i in range(3)]
    bridge.consumers.members[:] = consumers
    store.inbox.ingest([for_job(registry, "steady", "running")])
    bridge.start()
    try:
        assert handler.started.wait(60)
        until = Deadline(10.0, clock=clock)
        report = bridge.stop(until)
    finally:
        handler.release.set()
        bridge_store.close()

    assert state["all_in"].is_set(), "every consumer was stopping at the same time"
    assert [c.given for c in consumers] == [10.0, 10.0, 10.0], "each got the shared deadline"
    # The consumers used it all: the pool got none of it and abandoned the running handler
    # at once instead of waiting a deadline of its own.
    assert until.expired
    assert report.abandoned == 1
