"""SQS end to end: ``fencebridge run`` as a real process between moto and PostgreSQL.

Everything here crosses real boundaries: the bridge is a subprocess started from its TOML file,
SQS is moto's server over HTTP, the database is a real PostgreSQL, and faults are real ones: a
TCP proxy in front of the database that the test cuts, an HTTP gate in front of SQS that holds
``DeleteMessageBatch`` requests, SIGKILL and SIGTERM. Assertions are about the queue and the
database afterwards, never about how long anything took; waits poll with a deadline.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from tests.integration.conftest import cluster, cluster_db_url, pg_cluster, proxy
from tests.support.bridge_process import (
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
    free_port,
    run_to_exit,
    scrape,
)
from tests.support.handlers import create_tables
from tests.support.postgres import create_database, drop_database, unique_name
from tests.support.proxy import Proxy
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

__all__ = ["cluster", "cluster_db_url", "pg_cluster", "proxy"]  # fault-injection fixtures

RECORD = "record"
STEADY = "steady"
RECORD_JOB = Job("tests.support.handlers:RecordEffect", "A", lease_seconds=3.0)
STEADY_JOB = Job("tests.support.handlers:SteadyProgress", "B", lease_seconds=2.0)
TENANT = "t1"
DEADLINE = 90.0


# -- helpers ---------------------------------------------------------------------------------------


def send(
    sqs: Any, queue_url: str, operations: Sequence[str], *, job_type: str, body: object = None
) -> None:
    """Send one message per operation, in batches of ten."""
    text = json.dumps(body if body is not None else {})
    for start in range(0, len(operations), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": text,
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": TENANT},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": job_type},
                },
            }
            for i, op in enumerate(operations[start : start + 10])
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not response.get("Failed"), response


def on_queue(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages, as SQS counts them."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def queue_empty(sqs: Any, queue_url: str) -> bool:
    """Empty on two reads in a row: moto counts visible and in-flight messages one after the
    other, so a message whose visibility ends between the two counts is in neither."""
    if on_queue(sqs, queue_url) != (0, 0):
        return False
    time.sleep(0.05)
    return on_queue(sqs, queue_url) == (0, 0)


def peek_operations(sqs: Any, queue_url: str) -> list[str]:
    """The operation ids of every visible message; they are made visible again at once."""
    found: list[str] = []
    handles: list[str] = []
    while True:
        messages = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            break
        for m in messages:
            found.append(m["MessageAttributes"]["operation_id"]["StringValue"])
            handles.append(m["ReceiptHandle"])
    for start in range(0, len(handles), 10):
        entries = [
            {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
            for i, h in enumerate(handles[start : start + 10])
        ]
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)
    return found


def work_rows(url: str) -> dict[str, dict[str, Any]]:
    """Every work row of the test tenant, by operation id."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT operation_id, state, fence, attempts, receive_count, lease_owner,"
            "       lease_expires_at, updated_at"
            "  FROM work_item WHERE tenant_id = %s",
            (TENANT,),
        )
        names = [c.name for c in cur.description or []]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def effects(url: str) -> Counter[str]:
    """How many times each operation's class A effect was committed."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT operation_id FROM test_effect").fetchall()
    return Counter(op for (op,) in rows)


def rejected(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM rejected_delivery").fetchone()
    assert row is not None
    return int(row[0])


def all_succeeded(url: str, operations: Sequence[str]) -> bool:
    rows = work_rows(url)
    return all(op in rows and rows[op]["state"] == "succeeded" for op in operations)


def through(url: str, tcp: Proxy) -> str:
    """The same database, reached through the proxy."""
    return conninfo.make_conninfo(url, host=tcp.host, port=str(tcp.port))


# -- an HTTP gate in front of SQS --------------------------------------------------------------


class SqsGate:
    """Forwards SQS requests to the server, except the action it is told to hold.

    A held request is answered never: the client waits on it until the test kills the client,
    and on :meth:`release` the request is dropped without reaching SQS. Actions are recognised
    from the JSON protocol's ``X-Amz-Target`` header (or a query protocol's ``Action=``).
    """

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        assert parts.hostname is not None
        assert parts.port is not None
        self._upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._holding: str | None = None
        self._release = threading.Event()
        #: set when a request of the held action arrived; its body is in ``held_body``
        self.held = threading.Event()
        self.held_body = b""
        #: (action, request body) of every request that reached SQS
        self.forwarded: list[tuple[str, bytes]] = []
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                action = _action(self.headers.get("X-Amz-Target"), body)
                with gate._lock:
                    hold = action == gate._holding and not gate._release.is_set()
                    if hold:
                        gate.held_body = body
                        gate.held.set()
                if hold:
                    gate._release.wait()
                    self.close_connection = True  # dropped: it never reaches SQS
                    return
                status, headers, answer = gate._forward(self.command, self.path, self, body)
                with gate._lock:
                    gate.forwarded.append((action, body))
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hold(self, action: str) -> None:
        with self._lock:
            self._holding = action
            self._release.clear()
            self.held.clear()

    def release(self) -> None:
        """Stop holding; requests still held are dropped."""
        with self._lock:
            self._holding = None
            self._release.set()

    def deleted_entries(self) -> int:
        """Entries of every DeleteMessageBatch that reached SQS."""
        with self._lock:
            bodies = [b for a, b in self.forwarded if a == "DeleteMessageBatch"]
        return sum(len(json.loads(b)["Entries"]) for b in bodies)

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def _forward(
        self, method: str, path: str, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "connection"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()


def _action(target: str | None, body: bytes) -> str:
    if target:
        return target.rpartition(".")[2]
    form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
    return form.get("Action", [""])[0]


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture
def sqs(moto: SqsServer) -> Any:
    return moto.client()


@pytest.fixture
def gate(moto: SqsServer) -> Iterator[SqsGate]:
    g = SqsGate(moto.endpoint)
    try:
        yield g
    finally:
        g.close()


def config(moto_endpoint: str, queue_url: str, **settings: Any) -> SqsBridgeConfig:
    jobs = settings.pop("jobs", {RECORD: RECORD_JOB, STEADY: STEADY_JOB})
    return SqsBridgeConfig(queue_url=queue_url, endpoint_url=moto_endpoint, jobs=jobs, **settings)


# -- 1. acknowledged only after COMMIT ------------------------------------------------------------


@pytest.mark.slow
def test_nothing_is_deleted_while_the_database_refuses_the_commit(
    tmp_path: Path, moto: SqsServer, gate: SqsGate, cluster_db_url: str, proxy: Proxy
) -> None:
    sqs = moto.client()
    create_tables(cluster_db_url)
    queue_url = moto.create_queue("commit", VisibilityTimeout="2")
    # The gate only watches: every request reaches SQS, and it sees every delete.
    cfg = config(gate.url, queue_url, visibility_timeout_seconds=2)
    operations = [f"op-{i}" for i in range(10)]
    with BridgeProcess.start(cfg, tmp_path, bridge_env(through(cluster_db_url, proxy))) as bridge:
        bridge.wait_ready()
        proxy.stop()  # every connection cut; new ones refused: no transaction can commit
        send(sqs, queue_url, operations, job_type=RECORD)

        # The bridge receives every message while the database is away (all ten in flight at
        # once), its inbox transaction fails, and the messages come back when their visibility
        # ends (all ten visible again): nothing was deleted.
        all_in_flight = all_back = False
        end = time.monotonic() + DEADLINE
        failed_write = "sqs:orders:receive-0 failed (StoreUnavailable: ingest:"
        while not (all_back and failed_write in bridge.logs()):
            assert time.monotonic() < end, f"the messages did not come back; log:\n{bridge.logs()}"
            visible, in_flight = on_queue(sqs, queue_url)
            all_in_flight = all_in_flight or in_flight == 10
            all_back = all_back or (all_in_flight and visible == 10)
            time.sleep(0.02)
        assert gate.deleted_entries() == 0
        assert work_rows(cluster_db_url) == {}

        proxy.start()
        eventually(
            lambda: all_succeeded(cluster_db_url, operations) and queue_empty(sqs, queue_url),
            "every operation succeeded and the queue is empty",
        )
        assert bridge.terminate() == 0, bridge.logs()

    assert gate.deleted_entries() >= 10  # deleted only once committed
    rows = work_rows(cluster_db_url)
    assert sorted(rows) == sorted(operations)
    assert effects(cluster_db_url) == Counter(operations)  # ingested once, run once
    assert rejected(cluster_db_url) == 0


# -- 2. a crash between COMMIT and delete ---------------------------------------------------------


@pytest.mark.slow
def test_a_crash_between_commit_and_delete_costs_only_a_replay(
    tmp_path: Path, moto: SqsServer, sqs: Any, gate: SqsGate, db_url: str
) -> None:
    create_tables(db_url)
    queue_url = moto.create_queue("crash", VisibilityTimeout="2")
    cfg = config(gate.url, queue_url, visibility_timeout_seconds=2)
    operations = [f"op-{i}" for i in range(10)]
    send(sqs, queue_url, operations, job_type=RECORD)
    gate.hold("DeleteMessageBatch")

    with BridgeProcess.start(cfg, tmp_path, bridge_env(db_url)) as first:
        assert gate.held.wait(DEADLINE), f"no delete was attempted; log:\n{first.logs()}"
        first.kill()  # after the inbox committed, before SQS heard of the delete
    gate.release()

    held = len(json.loads(gate.held_body)["Entries"])
    committed = work_rows(db_url)
    assert len(committed) == held >= 1  # the batch was in the database before its delete
    assert gate.deleted_entries() == 0  # and nothing left the queue

    second_cfg = config(gate.url, queue_url, visibility_timeout_seconds=2)
    metrics = free_port()
    env = bridge_env(db_url, extra={"FENCEBRIDGE_PROMETHEUS_PORT": str(metrics)})
    with BridgeProcess.start(second_cfg, tmp_path, env) as second:
        eventually(
            lambda: all_succeeded(db_url, operations) and queue_empty(sqs, queue_url),
            "every operation succeeded and the queue is empty",
        )
        decisions = {
            d: scrape(metrics, "fencebridge_deliveries_total", decision=d, subscription="orders")
            for d in ("new", "replay", "conflict")
        }
        assert second.terminate() == 0, second.logs()

    rows = work_rows(db_url)
    assert sorted(rows) == sorted(operations)
    # The second bridge received and deleted every message, the killed batch included; the
    # killed batch's redeliveries were replays, and their rows are still the first ones.
    assert gate.deleted_entries() >= 10
    assert decisions["new"] == 10 - held
    assert decisions["replay"] >= held
    assert decisions["conflict"] == 0
    for op in committed:
        assert rows[op]["receive_count"] == 1, rows[op]
    assert effects(db_url) == Counter(operations)  # one effect each, the crash notwithstanding
    assert rejected(db_url) == 0


# -- 4. SIGTERM drains and loses nothing -----------------------------------------------------------


@pytest.mark.slow
def test_sigterm_drains_loses_nothing_and_a_second_bridge_finishes(
    tmp_path: Path, moto: SqsServer, sqs: Any, db_url: str
) -> None:
    create_tables(db_url)
    queue_url = moto.create_queue("drain", VisibilityTimeout="5")
    cfg = config(
        moto.endpoint,
        queue_url,
        jobs={STEADY: STEADY_JOB},
        worker_id="bridge-1",
        shutdown_deadline_seconds=1.0,
    )
    env = bridge_env(db_url, target_url=db_url)
    # Two operations keep working (and reporting progress) on their first attempt until their
    # lease is taken away: they outlast the shutdown deadline. The rest finish quickly.
    long_ops = ["long-0", "long-1"]
    sent: list[str] = []
    stop_sending = threading.Event()

    def sender() -> None:
        client = moto.client()
        send(client, queue_url, long_ops, job_type=STEADY, body={"busy_on_attempt": 1})
        sent.extend(long_ops)
        batch = 0
        while not stop_sending.is_set():
            ops = [f"op-{batch}-{i}" for i in range(5)]
            send(client, queue_url, ops, job_type=STEADY, body={"work_seconds": 0.2})
            sent.extend(ops)
            batch += 1
            stop_sending.wait(0.25)

    feeder = threading.Thread(target=sender, daemon=True)
    with BridgeProcess.start(cfg, tmp_path, env) as first:
        first.wait_ready()
        feeder.start()

        def long_running_short_done() -> bool:
            rows = work_rows(db_url)
            running = all(rows.get(op, {}).get("state") == "claimed" for op in long_ops)
            return running and sum(r["state"] == "succeeded" for r in rows.values()) >= 5

        eventually(long_running_short_done, "long operations running and short ones done")
        assert first.terminate() == 0, first.logs()  # with messages still arriving
        logs = first.logs()
    at_exit = len(sent)
    eventually(lambda: len(sent) >= at_exit + 5, "more messages after the exit")
    stop_sending.set()
    feeder.join(DEADLINE)

    stopped = re.search(r"bridge stopped: (\d+) released, (\d+) abandoned", logs)
    assert stopped, logs
    abandoned = int(stopped[2])

    # Nothing claimed is left behind except what was abandoned, and nobody renews those leases.
    rows = work_rows(db_url)
    claimed = {op: r for op, r in rows.items() if r["state"] == "claimed"}
    assert set(long_ops) <= set(claimed)
    assert len(claimed) <= abandoned
    assert {r["lease_owner"] for r in claimed.values()} == {"bridge-1"}
    # Claims that never started were released to the queue; everything else finished.
    assert {r["state"] for op, r in rows.items() if op not in claimed} <= {"queued", "succeeded"}
    with psycopg.connect(db_url, autocommit=True) as conn:
        eventually(
            lambda: bool(
                conn.execute(
                    "SELECT now() > max(lease_expires_at) FROM work_item WHERE state = 'claimed'"
                ).fetchone()[0]  # type: ignore[index]
            ),
            "the abandoned leases to lapse",
        )
    lapsed = work_rows(db_url)
    for op, row in claimed.items():
        assert lapsed[op]["state"] == "claimed"
        assert lapsed[op]["lease_expires_at"] == row["lease_expires_at"]  # never renewed

    # Every message is in the database or still on the queue.
    eventually(lambda: on_queue(sqs, queue_url)[1] == 0, "no message in flight")
    waiting = peek_operations(sqs, queue_url)
    assert set(sent) <= set(rows) | set(waiting)
    assert set(rows) <= set(sent)

    second_cfg = config(moto.endpoint, queue_url, jobs={STEADY: STEADY_JOB}, worker_id="bridge-2")
    with BridgeProcess.start(second_cfg, tmp_path, env) as second:
        eventually(
            lambda: all_succeeded(db_url, sent) and queue_empty(sqs, queue_url),
            "the second bridge drained everything",
        )
        assert second.terminate() == 0, second.logs()

    rows = work_rows(db_url)
    assert sorted(rows) == sorted(sent)
    for op in claimed:
        assert rows[op]["attempts"] == 2  # taken over after the lease lapsed
    with psycopg.connect(db_url, autocommit=True) as conn:
        targets: dict[str, int] = dict(
            conn.execute("SELECT operation_id, last_fence FROM test_target").fetchall()
        )
    # One target record per operation, written under the fence that settled it.
    assert targets == {op: row["fence"] for op, row in rows.items()}
    assert rejected(db_url) == 0


# -- 5. probes and start-up refusals -------------------------------------------------------------


@pytest.mark.slow
def test_readiness_follows_the_database(
    tmp_path: Path, moto: SqsServer, cluster_db_url: str, proxy: Proxy
) -> None:
    queue_url = moto.create_queue("probes")
    cfg = config(moto.endpoint, queue_url)
    with BridgeProcess.start(cfg, tmp_path, bridge_env(through(cluster_db_url, proxy))) as bridge:
        bridge.wait_ready()
        assert bridge.probe("/healthz") == (200, {"status": "ok"})
        status, body = bridge.probe("/readyz")
        assert status == 200
        assert body == {"ready": True, "checks": {"database": "ok", "subscription:orders": "ok"}}

        proxy.stop()
        bridge.wait_for("/readyz", 503)
        # Other checks (a loop that needs the database) may turn red first; the database's
        # own check follows, with a reason rather than a bare failure.
        eventually(
            lambda: bridge.probe("/readyz")[1]["checks"]["database"] != "ok",
            "the database check to fail",
        )
        status, body = bridge.probe("/readyz")
        assert status == 503
        assert body["ready"] is False
        assert body["checks"]["database"], body
        assert bridge.probe("/healthz") == (200, {"status": "ok"})  # alive, only not ready

        proxy.start()
        body = bridge.wait_for("/readyz", 200)
        assert body["checks"]["database"] == "ok"
        assert bridge.terminate() == 0, bridge.logs()


@pytest.mark.slow
def test_an_invalid_configuration_exits_1_naming_file_and_key(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    cfg = config(moto.endpoint, moto.create_queue("bad"))
    path = tmp_path / "bridge.toml"
    path.write_text(cfg.toml().replace("wait_seconds = 1", "wait_seconds = 21"), encoding="utf-8")
    done = run_to_exit(path, bridge_env(db_url))
    assert done.returncode == 1
    assert f"{path}: subscriptions.orders.wait_seconds: must be from 0 to 20" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("key", [None, "too-short"])
def test_a_missing_or_weak_identity_key_exits_1_naming_it(
    tmp_path: Path, moto: SqsServer, db_url: str, key: str | None
) -> None:
    path = config(moto.endpoint, moto.create_queue("key")).write(tmp_path)
    done = run_to_exit(path, bridge_env(db_url, identity_key=key))
    assert done.returncode == 1
    assert "FENCEBRIDGE_IDENTITY_KEY" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow
def test_an_unmigrated_database_is_refused(
    tmp_path: Path, moto: SqsServer, pg_admin_url: str
) -> None:
    name = unique_name("fbt_empty")
    url = create_database(pg_admin_url, name)
    try:
        path = config(moto.endpoint, moto.create_queue("empty")).write(tmp_path)
        done = run_to_exit(path, bridge_env(url))
    finally:
        drop_database(pg_admin_url, name)
    assert done.returncode == 4
    assert "fencebridge migrate" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
