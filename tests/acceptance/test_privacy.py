"""No raw identifier and no payload byte leaves a running bridge: not in logs, spans or metrics.

``fencebridge run`` runs as a real process with JSON logs at DEBUG, its traces and metrics
exported over OTLP/HTTP to a collector this test runs, and its metrics served for Prometheus.
Its deliveries carry distinctive tenant ids, operation ids and payload bytes through every path
that writes something an operator reads: new work, a replay, a conflict, undecodable messages
(one whose job type *is* a raw tenant id), a worker that loses its lease and is taken over, a
class D call whose error quotes the tenant, operation and payload (parked unknown), a handler
quarantine, and two tenants that use the same operation id.

Everything the process emitted is then searched byte for byte (the log file, every OTLP request
body, the Prometheus page) and field by field (every span and event attribute, every metric
label) for the raw strings. The same material must carry the keyed hashes instead, which shows
the search looked at real output.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.handlers import Context, UnfencedHandler
from bridge.identity import IdentityHasher
from bridge.telemetry import names as n
from tests.support.bridge_process import (
    IDENTITY_KEY,
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
    free_port,
)
from tests.support.handlers import create_tables
from tests.support.otlp import Collector, Exported, otlp_collector, read_exports
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

TENANT = "tenant-RAW-7f3a"
OTHER_TENANT = "tenant-RAW-c81e"
OPERATION = "op-RAW-91c2"
PAYLOAD = "PAYLOAD-RAW-55d1"
#: what must never appear anywhere (compared case-insensitively)
RAW = (TENANT, OTHER_TENANT, OPERATION, PAYLOAD)


class AmbiguousNotify(UnfencedHandler):
    """Class D: the payload must be JSON; the target never answers, and the error says it all.

    The exception quotes the raw tenant, operation and payload, as careless client code does:
    fencebridge must classify it by type and never pass its text on.
    """

    def validate(self, ctx: Context) -> None:
        ctx.json()  # a payload that is not JSON is quarantined

    def call(self, ctx: Context) -> None:
        raise TimeoutError(
            f"no answer for tenant {ctx.tenant_id} operation {ctx.operation_id}: {ctx.payload!r}"
        )


JOBS = {
    "steady": Job("tests.support.handlers:SteadyProgress", "B", lease_seconds=1.0),
    "notify": Job("tests.acceptance.test_privacy:AmbiguousNotify", "D", max_attempts=1),
}


@dataclass(frozen=True)
class Message:
    body: str
    attributes: dict[str, str]


def message(tenant: str | None, operation: str | None, job_type: str, body: object) -> Message:
    attributes = {"job_type": job_type}
    if tenant is not None:
        attributes["tenant_id"] = tenant
    if operation is not None:
        attributes["operation_id"] = operation
    return Message(body if isinstance(body, str) else json.dumps(body), attributes)


#: at most ten, so the bridge receives them as one batch
MESSAGES = (
    message(TENANT, f"{OPERATION}-ok", "steady", {"note": PAYLOAD}),
    message(TENANT, f"{OPERATION}-ok", "steady", {"note": PAYLOAD}),  # replay
    message(TENANT, f"{OPERATION}-ok", "steady", {"note": f"{PAYLOAD}-changed"}),  # conflict
    message(OTHER_TENANT, f"{OPERATION}-ok", "steady", {"note": PAYLOAD}),  # same id, new tenant
    message(TENANT, f"{OPERATION}-stall", "steady", {"stall_on_attempt": 1, "note": PAYLOAD}),
    message(TENANT, f"{OPERATION}-unknown", "notify", {"note": PAYLOAD}),
    message(TENANT, f"{OPERATION}-unreadable", "notify", f"{PAYLOAD} is not JSON"),
    message(TENANT, None, "steady", {"note": PAYLOAD}),  # no operation id: quarantined
    message(TENANT, f"{OPERATION}-job", TENANT, {"note": PAYLOAD}),  # unknown job type
)
#: work rows by final state once the run is over
FINAL_STATES = {"succeeded": 3, "unknown": 1, "quarantined": 1}


@pytest.fixture
def collector() -> Iterator[Collector]:
    with otlp_collector() as running:
        yield running


@pytest.fixture(scope="module")
def sqs() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def leaks(text: str) -> list[str]:
    lowered = text.lower()
    return [raw for raw in RAW if raw.lower() in lowered]


def states(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT state, count(*) FROM work_item GROUP BY state").fetchall()
    return {str(state): int(count) for state, count in rows}


def rejected(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM rejected_delivery").fetchone()
    assert row is not None
    return int(row[0])


def queue_empty(client: Any, queue_url: str) -> bool:
    found = client.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return all(int(v) == 0 for v in found.values())


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Emitted:
    log: str
    exports: Exported
    raw_exports: list[bytes]
    prometheus: str


@pytest.fixture
def emitted(sqs: SqsServer, collector: Collector, db_url: str, tmp_path: Path) -> Emitted:
    """Run the bridge over the messages to the end, then stop it: everything it emitted."""
    create_tables(db_url)
    client = sqs.client()
    queue_url = sqs.create_queue("privacy", VisibilityTimeout="30")
    for m in MESSAGES:
        client.send_message(
            QueueUrl=queue_url,
            MessageBody=m.body,
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v} for k, v in m.attributes.items()
            },
        )
    prometheus_port = free_port()
    env = bridge_env(
        db_url,
        extra={
            "FENCEBRIDGE_LOG_FORMAT": "json",
            "FENCEBRIDGE_LOG_LEVEL": "DEBUG",
            "FENCEBRIDGE_PROMETHEUS_PORT": str(prometheus_port),
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        },
    )
    config = SqsBridgeConfig(queue_url=queue_url, endpoint_url=sqs.endpoint, jobs=JOBS)
    with BridgeProcess.start(config, tmp_path, env) as bridge:
        bridge.wait_ready()
        eventually(lambda: states(db_url) == FINAL_STATES, "every operation to settle or park")
        eventually(lambda: rejected(db_url) == 3, "the conflict and both undecodable messages")
        eventually(lambda: queue_empty(client, queue_url), "every delivery to be deleted")
        url = f"http://127.0.0.1:{prometheus_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            prometheus = response.read().decode()
        assert bridge.terminate() == 0, bridge.logs()  # flushes the exporters on the way out
        log = bridge.logs()
    raw_exports = collector.bodies("/v1/traces") + collector.bodies("/v1/metrics")
    return Emitted(log, read_exports(collector), raw_exports, prometheus)


def test_no_raw_identifier_or_payload_reaches_logs_spans_or_metrics(emitted: Emitted) -> None:
    assert leaks(emitted.log) == [], "raw identifiers in the log"
    for body in emitted.raw_exports:
        assert leaks(body.decode("utf-8", "replace")) == [], "raw identifiers in an OTLP export"
    for text in emitted.exports.strings:
        assert leaks(text) == [], f"raw identifiers in an exported field: {text!r}"
    assert leaks(emitted.prometheus) == [], "raw identifiers on the Prometheus page"

    # The search looked at real output: the run's spans, events and metrics are all there,
    # carrying hashes where identifiers would be.
    hasher = IdentityHasher(IDENTITY_KEY.encode())
    spans, metrics = emitted.exports.spans, emitted.exports.metrics
    assert {"receive orders", "inbox write orders", "process orders"} <= set(spans)
    for event in (n.EVENT_DECISION, n.EVENT_LEASE_LOST, n.EVENT_PARKED_UNKNOWN):
        assert f"event:{event}" in spans, event
    tenants = {s.get(n.TENANT_HASH) for s in spans["process orders"]}
    assert tenants == {hasher.tenant(TENANT), hasher.tenant(OTHER_TENANT)}
    operations = {s.get(n.OPERATION_HASH) for s in spans["process orders"]}
    assert hasher.operation(TENANT, f"{OPERATION}-stall") in operations
    for name in (n.METRIC_DELIVERIES, n.METRIC_COMPLETIONS, n.METRIC_LEASE_LOST):
        assert name in metrics, name
    decisions = {labels[n.LABEL_DECISION] for labels in metrics[n.METRIC_DELIVERIES]}
    assert decisions == {"new", "replay", "conflict", "quarantined"}
    assert "fencebridge_deliveries_total{" in emitted.prometheus


@pytest.mark.slow
def test_log_lines_are_json_with_hashed_identifiers_on_every_decision(emitted: Emitted) -> None:
    lines = [json.loads(line) for line in emitted.log.splitlines() if line.strip()]
    for entry in lines:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
    decisions = [e for e in lines if e["logger"] == "fencebridge.decisions"]
    hasher = IdentityHasher(IDENTITY_KEY.encode())

    def hashes(tenant: str, operation: str) -> dict[str, str]:
        return {
            n.TENANT_HASH: hasher.tenant(tenant),
            n.OPERATION_HASH: hasher.operation(tenant, operation),
        }

    def decided(decision: str) -> list[dict[str, Any]]:
        return [e for e in decisions if e.get(n.DECISION) == decision]

    def said(text: str) -> list[dict[str, Any]]:
        return [e for e in decisions if text in e["message"]]

    (conflict,) = decided("conflict")
    assert hashes(TENANT, f"{OPERATION}-ok").items() <= conflict.items()
    quarantined = decided("quarantined")
    assert sorted(e[n.REASON] for e in quarantined) == ["missing_operation_id", "unknown_job_type"]
    (job,) = [e for e in quarantined if e[n.REASON] == "unknown_job_type"]
    assert hashes(TENANT, f"{OPERATION}-job").items() <= job.items()
    (lost,) = said("lease lost")
    assert hashes(TENANT, f"{OPERATION}-stall").items() <= lost.items()
    assert lost[n.ACTION] == "handler"
    (unknown,) = said("parked as unknown")
    assert hashes(TENANT, f"{OPERATION}-unknown").items() <= unknown.items()
    (unreadable,) = said("quarantined by its handler")
    assert hashes(TENANT, f"{OPERATION}-unreadable").items() <= unreadable.items()
    assert unreadable[n.OUTCOME_CODE] == "JSONDecodeError"
    for entry in decisions:
        assert entry["level"] == "warning"
        assert n.JOB_TYPE in entry or n.DECISION in entry, entry
