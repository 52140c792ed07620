"""Log output: JSON or text, one line per record, decision lines with hashed identifiers."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from bridge.identity import IdentityHasher
from bridge.telemetry import Telemetry
from bridge.telemetry import names as n
from bridge.telemetry.logs import (
    LOG_FORMAT_ENV,
    LOG_LEVEL_ENV,
    WIRE_LOGGERS,
    JsonFormatter,
    configure_logging,
)
from bridge.types import Claim, State, TargetClass

TENANT = "tenant-raw-logs-1"
OPERATION = "op-raw-logs-1"
PAYLOAD = b"payload-raw-logs-1"
hasher = IdentityHasher(b"log-unit-tests-identity-secret-01")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging replaces the root handlers and sets levels: put everything back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    wire = {name: logging.getLogger(name).level for name in WIRE_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in wire.items():
        logging.getLogger(name).setLevel(was)


def captured(fmt: str | None = None, level: str | None = None) -> io.StringIO:
    """Configure logging as the bridge does, writing into a buffer."""
    configure_logging(fmt, level)
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    handler.setStream(buffer)
    return buffer


def record(message: str = "lease lost for fence %d", *args: object, **fields: object) -> str:
    entry = logging.LogRecord(
        "fencebridge.decisions", logging.WARNING, __file__, 1, message, args, None
    )
    entry.fencebridge = fields
    return JsonFormatter().format(entry)


# -- the JSON format -----------------------------------------------------------------------------


def test_a_json_line_has_time_level_logger_message_and_the_structured_fields() -> None:
    line = record("lease lost for fence %d", 7, **{n.TENANT_HASH: "t_abc", n.FENCE: "7"})
    entry = json.loads(line)
    assert entry.pop("message") == "lease lost for fence 7"
    assert entry.pop("level") == "warning"
    assert entry.pop("logger") == "fencebridge.decisions"
    when = datetime.fromisoformat(entry.pop("time"))
    assert when.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - when) < timedelta(minutes=5)
    assert entry == {n.TENANT_HASH: "t_abc", n.FENCE: "7"}


def test_a_json_line_renders_values_json_cannot_hold_as_text() -> None:
    entry = json.loads(record("x", **{"when": datetime(2026, 1, 2, tzinfo=UTC)}))
    assert entry["when"] == "2026-01-02 00:00:00+00:00"


def test_json_output_is_one_line_per_record_even_with_a_traceback(
    restore_logging: None,
) -> None:
    buffer = captured("json")
    log = logging.getLogger("bridge.runtime.worker")
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("executor failed unexpectedly")
    log.info("after")
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2
    failed, after = (json.loads(line) for line in lines)
    assert failed["message"] == "executor failed unexpectedly"
    assert failed["level"] == "error"
    assert "RuntimeError: boom" in failed["exception"]
    assert after["message"] == "after"
    assert "exception" not in after


# -- the text format -----------------------------------------------------------------------------


def test_the_text_format_renders_the_structured_fields_after_the_message(
    restore_logging: None,
) -> None:
    buffer = captured("text")
    logging.getLogger("fencebridge.decisions").warning(
        "lease lost", extra={"fencebridge": {n.TENANT_HASH: "t_abc", n.ACTION: "heartbeat"}}
    )
    logging.getLogger("bridge.runtime.process").warning("plain line")
    decision, plain = buffer.getvalue().splitlines()
    assert decision.endswith(
        f"WARNING fencebridge.decisions: lease lost {n.TENANT_HASH}=t_abc {n.ACTION}=heartbeat"
    )
    assert plain.endswith("WARNING bridge.runtime.process: plain line")


# -- choosing format and level -------------------------------------------------------------------


def test_the_environment_chooses_format_and_level(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_FORMAT_ENV, "JSON")
    monkeypatch.setenv(LOG_LEVEL_ENV, "warning")
    buffer = captured()
    logging.getLogger("bridge.runtime.process").info("hidden")
    logging.getLogger("bridge.runtime.process").warning("shown")
    (line,) = buffer.getvalue().splitlines()
    assert json.loads(line)["message"] == "shown"


def test_text_is_the_default_format(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOG_FORMAT_ENV, raising=False)
    buffer = captured()
    logging.getLogger("bridge.runtime.process").warning("shown")
    assert buffer.getvalue().rstrip().endswith("WARNING bridge.runtime.process: shown")


def test_wire_level_client_logs_stay_at_info_when_fencebridge_debugs(
    restore_logging: None,
) -> None:
    """botocore and friends log whole message bodies at DEBUG."""
    buffer = captured("json", "debug")
    logging.getLogger("bridge.runtime.worker").debug("ours")
    for name in ("botocore.parsers", "urllib3.connectionpool", "google.api_core", "grpc"):
        logging.getLogger(name).debug("b'%s'", PAYLOAD.decode())
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
        assert logging.getLogger(name).isEnabledFor(logging.INFO), name
    (line,) = buffer.getvalue().splitlines()
    assert json.loads(line)["message"] == "ours"


# -- decision lines from the recorder ------------------------------------------------------------


def claim(fence: int = 3) -> Claim:
    return Claim(
        tenant_id=TENANT,
        operation_id=OPERATION,
        fence=fence,
        attempts=fence,
        max_attempts=5,
        subscription="orders",
        job_type="refund",
        target_class=TargetClass.B,
        schema_version=None,
        payload=PAYLOAD,
        payload_hash=b"\0" * 32,
        lease_expires_at=datetime.now(UTC),
        intent_fence=None,
        takeover=True,
    )


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry(hasher, tracer_provider=TracerProvider(), meter_provider=MeterProvider())


def test_one_json_line_per_decision_worth_attention_with_hashed_identity(
    restore_logging: None, telemetry: Telemetry
) -> None:
    buffer = captured("json")
    c = claim()
    telemetry.claimed(c)
    telemetry.settled(c, State.SUCCEEDED, "ok")  # routine: no line
    telemetry.settled(c, State.QUEUED, "retry")  # routine: no line
    telemetry.reconciled(c, "applied")  # routine: no line
    telemetry.lease_lost(c, "heartbeat")
    telemetry.fenced_out(c)
    telemetry.settled(c, State.UNKNOWN, "TimeoutError")
    telemetry.settled(c, State.QUARANTINED, "unreadable")
    telemetry.settle_unknown(c, "complete")
    text = buffer.getvalue()
    for raw in (TENANT, OPERATION, PAYLOAD.decode()):
        assert raw not in text
    entries = [json.loads(line) for line in text.splitlines()]
    assert [e["message"].split(":")[0] for e in entries] == [
        "lease lost",
        "stale write fenced out by the target",
        "operation parked as unknown",
        "operation quarantined by its handler",
        "settlement outcome unknown (database unavailable); the lease will lapse",
    ]
    identity = {
        n.JOB_TYPE: "refund",
        n.TENANT_HASH: hasher.tenant(TENANT),
        n.OPERATION_HASH: hasher.operation(TENANT, OPERATION),
        n.FENCE: "3",
    }
    for entry in entries:
        assert entry["logger"] == "fencebridge.decisions"
        assert entry["level"] == "warning"
        assert identity.items() <= entry.items()
    assert entries[0][n.ACTION] == "heartbeat"
    assert entries[3][n.OUTCOME_CODE] == "unreadable"
    assert entries[4][n.ACTION] == "complete"
