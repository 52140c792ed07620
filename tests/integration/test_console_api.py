"""The console's JSON API, served over real HTTP on a free port, over a real database holding
rows in every state: counts, keyset pages, one operation, rejected deliveries and redrive, with
its authentication, roles, security headers and refusals. Every answer is checked for the
security headers, and the bodies of a tour of every route are scanned for raw identifiers and
payload bytes.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis import Case
from schemathesis.checks import positive_data_acceptance

from bridge import keyring
from bridge.config import parse_config
from bridge.console.api import ROUTES, ConsoleApi
from bridge.console.auth import Role, Tokens
from bridge.console.openapi import document
from bridge.console.server import SECURITY_HEADERS, ConsoleServer
from bridge.database import connect
from bridge.errors import ConfigError
from bridge.handlers import Applied, Context, IdempotentApiHandler, Success
from bridge.identity import IdentityHasher
from bridge.operator.check import Report, evaluate, read_database
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, Rejection, State, TargetClass
from tests.support.bridge_process import free_port

Db = psycopg.Connection[Any]
LEASE = timedelta(seconds=60)
HASHER = IdentityHasher(b"console-api-integration-secret-0123")
VIEWER = "viewer-token-aaaaaaaaaaaaaaaaaaaaaa"
OPERATOR = "operator-token-bbbbbbbbbbbbbbbbbbbbbb"
PAYLOAD = "payload-token-cccccccccccccccccccccccc"
#: the console's tokens in the tests: a viewer, an operator and a payload reader
TOKENS = f"vera:viewer:{VIEWER},olga:operator:{OPERATOR},pia:payload:{PAYLOAD}"
TENANTS = ("tenant-raw-acme", "tenant-raw-globex")
PAYLOAD_MARK = "PAYLOAD-BYTES-7f3a"
PREVIEW = {"reason": "r", "dry_run": True}
#: generated requests per route for the contract check
CONTRACT_EXAMPLES = 10
CONFIG = """
[jobs.charge]
handler = "tests.integration.test_console_api:Charge"
target_class = "C"

[jobs.mail]
handler = "tests.integration.test_console_api:Charge"
target_class = "C"

[subscriptions.orders]
source = "sqs"
queue_url = "http://127.0.0.1:9/queue/orders"
job_types = ["charge", "mail"]

[subscriptions.orders.decode]
tenant_id = "attribute:tenant"
operation_id = "body:/id"
job_type = "attribute:type"
payload = "body:/data"
"""


class Charge(IdempotentApiHandler):
    """The provider's record says every charge it is asked about was applied."""

    def perform(self, ctx: Context, key: str) -> Success:
        return Success("charged")

    def lookup(self, ctx: Context, key: str) -> Applied:
        return Applied("charged", "ch_1")


def delivery(tenant: str, op: str, job: str = "charge", mark: str = PAYLOAD_MARK) -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="orders",
        job_type=job,
        target_class=TargetClass.C,
        payload=json.dumps({"card": mark, "op": op}).encode(),
        max_attempts=1,
    )


def check_of(url: str) -> Callable[[], Report]:
    """The go/no-go report of :data:`CONFIG` over the database at ``url``, as the command's."""
    config = parse_config(CONFIG)

    def report() -> Report:
        with connect(url) as conn:
            facts = read_database(conn)
        return evaluate(config, facts)

    return report


def console_api(store: PostgresStore, url: str) -> ConsoleApi:
    return ConsoleApi(store, parse_config(CONFIG), HASHER, checks=check_of(url))


def populate(store: PostgresStore) -> list[str]:
    """Rows in every state under two tenants; returns every raw operation id."""
    ops: list[str] = []
    for t, tenant in enumerate(TENANTS):
        fresh = [
            delivery(tenant, f"op-raw-{t}-{i}", "charge" if i % 2 else "mail") for i in range(9)
        ]
        store.inbox.ingest(fresh)
        ops += [d.operation_id for d in fresh]
        claims = store.claims.claim_keys("worker-1", [d.key for d in fresh[:5]], LEASE)
        store.settle.settle(Settlement(claims[0].ticket, State.SUCCEEDED, "ok"))
        store.settle.settle(Settlement(claims[1].ticket, State.FAILED_TERMINAL, "declined"))
        store.settle.settle(Settlement(claims[2].ticket, State.UNKNOWN, "timeout"))
        store.settle.settle(Settlement(claims[3].ticket, State.QUARANTINED, "bad_schema"))
        # claims[4] stays claimed; fresh[5:] stay queued
    store.inbox.ingest(
        [
            delivery(TENANTS[0], "op-raw-0-0", mark="CONFLICTING-" + PAYLOAD_MARK),
            Rejection(
                subscription="orders",
                reason="operation id missing",
                body=PAYLOAD_MARK.encode(),
                tenant_id=TENANTS[1],
            ),
        ]
    )
    return ops


@dataclass
class Console:
    port: int
    ops: list[str]
    bodies: list[bytes]

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = OPERATOR,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        try:
            conn.request(method, path, body=data, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
        finally:
            conn.close()
        for name, value in SECURITY_HEADERS.items():
            assert answer.getheader(name) == value, (path, name)
        self.bodies.append(raw)
        return answer.status, json.loads(raw)


@pytest.fixture
def console(store: PostgresStore, db_url: str) -> Iterator[Console]:
    keyring.attach(store.keys, HASHER, used_by="test")
    ops = populate(store)
    server = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0)
    server.start()
    try:
        yield Console(server.port, ops, [])
    finally:
        server.stop()


def test_counts_match_the_database(console: Console, db: Db) -> None:
    status, body = console.call("GET", "/api/v1/counts", token=VIEWER)

    assert status == 200
    expected: dict[tuple[str, str, str], dict[str, int]] = {}
    for sub, job, tenant, state, n in db.execute(
        "SELECT subscription, job_type, tenant_id, state, count(*) FROM work_item"
        " GROUP BY 1, 2, 3, 4"
    ):
        expected.setdefault((sub, job, HASHER.tenant(tenant)), {})[state] = n
    got = {
        (c["subscription"], c["job_type"], c["tenant"]): {s: n for s, n in c["states"].items() if n}
        for c in body["counts"]
    }
    assert got == expected
    assert set(body["totals"].values()) != {0}
    assert sum(body["totals"].values()) == len(console.ops)


@pytest.mark.parametrize("state", ["queued", "succeeded"])
def test_keyset_pages_walk_every_row_once(console: Console, db: Db, state: str) -> None:
    seen: list[str] = []
    path = f"/api/v1/rows?state={state}&limit=2"
    pages = 0
    while path:
        status, body = console.call("GET", path, token=VIEWER)
        assert status == 200
        assert len(body["rows"]) <= 2
        seen += [r["operation"] for r in body["rows"]]
        pages += 1
        cursor = body["next_cursor"]
        path = f"/api/v1/rows?state={state}&limit=2&cursor={cursor}" if cursor else ""

    expected = [
        HASHER.operation(t, o)
        for t, o in db.execute(
            "SELECT tenant_id, operation_id FROM work_item WHERE state = %s ORDER BY seq", (state,)
        )
    ]
    assert seen == expected
    assert len(set(seen)) == len(seen)
    assert pages >= len(expected) // 2


def test_rows_filter_by_job_type(console: Console, db: Db) -> None:
    status, body = console.call("GET", "/api/v1/rows?state=queued&job_type=mail", token=VIEWER)

    assert status == 200
    (n,) = db.execute(  # type: ignore[misc]
        "SELECT count(*) FROM work_item WHERE state = 'queued' AND job_type = 'mail'"
    ).fetchone()
    assert len(body["rows"]) == n > 0
    assert {r["job_type"] for r in body["rows"]} == {"mail"}


def test_no_token_or_a_wrong_one_is_refused(console: Console) -> None:
    assert console.call("GET", "/api/v1/counts", token=None)[0] == 401
    assert console.call("GET", "/api/v1/counts", token=VIEWER + "x")[0] == 401
    status, body = console.call("GET", "/api/v1/nowhere", token=None)
    assert (status, body["detail"]) == (401, "a bearer token is required")


def test_a_viewer_cannot_redrive(console: Console, db: Db) -> None:
    status, body = console.call(
        "POST", "/api/v1/redrive", {"reason": "try", "dry_run": False}, token=VIEWER
    )

    assert status == 403
    assert "viewer" in body["detail"]
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)


def test_a_dry_run_changes_nothing_and_a_redrive_is_audited_with_the_token_name(
    console: Console, db: Db
) -> None:
    snapshot = "SELECT * FROM work_item ORDER BY tenant_id, operation_id"
    before = db.execute(snapshot).fetchall()
    request = {"reason": "provider recovered", "states": ["unknown"], "tenant_id": TENANTS[0]}

    status, preview = console.call("POST", "/api/v1/redrive", {**request, "dry_run": True})
    assert status == 200
    assert [(r["to"], r["note"]) for r in preview["rows"]] == [("succeeded", "lookup: applied")]
    assert db.execute(snapshot).fetchall() == before
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)

    status, done = console.call("POST", "/api/v1/redrive", {**request, "dry_run": False})
    assert status == 200
    assert done["moved"] == 1
    assert db.execute(
        "SELECT tenant_id, actor, reason, to_state FROM redrive_audit"
    ).fetchall() == [(TENANTS[0], "olga", "provider recovered", "succeeded")]


def test_one_operation_and_the_rejected_list_show_hashes_only(console: Console) -> None:
    tenant, op = TENANTS[0], "op-raw-0-0"
    status, found = console.call(
        "POST", "/api/v1/operation", {"tenant_id": tenant, "operation_id": op}, token=VIEWER
    )
    assert status == 200
    assert found["tenant"] == HASHER.tenant(tenant)
    assert found["operation"] == HASHER.operation(tenant, op)
    assert found["work_row"]["state"] == "succeeded"
    assert [r["kind"] for r in found["rejected_deliveries"]] == ["conflict"]

    status, rejected = console.call("GET", "/api/v1/rejected?limit=1", token=VIEWER)
    assert status == 200
    assert len(rejected["rejected"]) == 1
    status, rest = console.call(
        "GET", f"/api/v1/rejected?cursor={rejected['next_cursor']}", token=VIEWER
    )
    assert [r["kind"] for r in rejected["rejected"] + rest["rejected"]] == [
        "conflict",
        "quarantined",
    ]
    assert rest["next_cursor"] is None


def test_no_answer_carries_a_raw_identifier_or_payload_byte(console: Console) -> None:
    """A tour of every route, then a scan of every body it got back."""
    console.call("GET", "/api/v1/counts")
    for state in ("queued", "claimed", "succeeded", "failed_terminal", "unknown", "quarantined"):
        assert console.call("GET", f"/api/v1/rows?state={state}")[0] == 200
    console.call("GET", "/api/v1/rejected")
    for tenant in TENANTS:
        for op in console.ops:
            body = {"tenant_id": tenant, "operation_id": op}
            console.call("POST", "/api/v1/operation", body)
    console.call("POST", "/api/v1/redrive", {"reason": "look", "dry_run": True})
    console.call("POST", "/api/v1/redrive", {"reason": "go", "dry_run": False})
    assert console.call("GET", "/api/v1/checks")[0] == 200
    for window in ("15m", "1h", "6h", "24h"):
        assert console.call("GET", f"/api/v1/figures?window={window}")[0] == 200

    secrets = [*TENANTS, *console.ops, PAYLOAD_MARK]
    leaks = [s for raw in console.bodies for s in secrets if s.encode() in raw]
    assert leaks == []
    assert len(console.bodies) > 2 * len(console.ops)


#: bad input, each with the words its answer's reason must contain
BAD_INPUT: list[tuple[str, str, Any, str]] = [
        ("GET", "/api/v1/rows?state=lost", None, "unknown state"),
        ("GET", "/api/v1/rows", None, "state is required"),
        ("GET", "/api/v1/rows?state=queued&cursor=bm9wZQ", None, "bad cursor"),
        ("GET", "/api/v1/rows?state=queued&cursor=%%%", None, "bad cursor"),
        ("GET", "/api/v1/rows?state=queued&limit=0", None, "limit must be"),
        ("GET", "/api/v1/rows?state=queued&colour=red", None, "unknown query parameter"),
        ("GET", "/api/v1/rejected?kind=other", None, "unknown kind"),
        ("POST", "/api/v1/redrive", {"dry_run": True}, "reason is required"),
        ("POST", "/api/v1/redrive", {"reason": " ", "dry_run": True}, "reason must be"),
        ("POST", "/api/v1/redrive", {"reason": "r"}, "dry_run is required"),
        ("POST", "/api/v1/redrive", {**PREVIEW, "states": ["queued"]}, "'unknown' or 'quar"),
        ("POST", "/api/v1/redrive", {**PREVIEW, "operation_id": "x"}, "needs tenant_id"),
        ("POST", "/api/v1/redrive", {**PREVIEW, "limit": 0}, "limit must be"),
        ("POST", "/api/v1/redrive", {**PREVIEW, "force": True}, "unknown field"),
        ("POST", "/api/v1/redrive", b"{not json", "not valid JSON"),
        ("POST", "/api/v1/redrive", [1], "must be a JSON object"),
        ("POST", "/api/v1/operation", {"tenant_id": "t"}, "operation_id is required"),
]  # fmt: skip


def test_bad_input_is_refused_with_its_reason(console: Console) -> None:
    answers = [
        (console.call(method, path, body), reason) for method, path, body, reason in BAD_INPUT
    ]

    assert [(status, reason in problem["detail"]) for (status, problem), reason in answers] == [
        (400, True)
    ] * len(BAD_INPUT)


def test_writes_need_json_and_routes_their_method(console: Console) -> None:
    status, problem = console.call(
        "POST", "/api/v1/redrive", b"reason=x", content_type="application/x-www-form-urlencoded"
    )
    assert (status, problem["title"]) == (415, "unsupported media type")
    assert console.call("DELETE", "/api/v1/counts")[0] == 405
    assert console.call("BREW", "/api/v1/counts")[0] == 405
    assert console.call("GET", "/api/v1/nowhere")[0] == 404


def test_a_request_the_http_layer_refuses_is_answered_with_a_status(console: Console) -> None:
    with socket.create_connection(("127.0.0.1", console.port), timeout=10) as sock:
        # a head larger than the HTTP layer reads: refused before any route sees it
        sock.sendall(b"GET /api/v1/counts HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 3000)
        raw = b"".join(iter(lambda: sock.recv(4096), b""))
    assert raw.startswith(b"HTTP/1.1 4")


def test_a_failing_request_does_not_stop_the_server(console: Console, db: Db) -> None:
    db.execute("ALTER TABLE rejected_delivery RENAME TO rejected_delivery_away")

    status, problem = console.call("GET", "/api/v1/rejected")
    assert status == 500
    assert "rejected_delivery" not in problem["detail"]
    assert console.call("GET", "/api/v1/counts")[0] == 200


def test_the_openapi_document_describes_exactly_the_routes_served(console: Console) -> None:
    status, document = console.call("GET", "/api/v1/openapi.json", token=VIEWER)
    assert status == 200
    validate(document)
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert {(r.method, r.path) for r in ROUTES} == documented
    row = console.call("GET", "/api/v1/rows?state=unknown")[1]["rows"][0]["handle"]
    groups = console.call("GET", "/api/v1/groups")[1]["groups"]
    group = next(g["handle"] for g in groups if g["redrivable"])
    delivery = console.call("GET", "/api/v1/rejected")[1]["rejected"][0]["handle"]
    minimal = {
        "/api/v1/operation": {"tenant_id": TENANTS[0], "operation_id": "op-raw-0-0"},
        "/api/v1/redrive": PREVIEW,
        "/api/v1/rows": None,
        "/api/v1/payload": {"tenant_id": TENANTS[0], "operation_id": "op-raw-0-0", "reason": "r"},
        "/api/v1/groups/{handle}/redrive": PREVIEW,
        "/api/v1/resolve": {"delivery": delivery, **PREVIEW},
    }
    handles = {
        "/api/v1/operations/{handle}": row,
        "/api/v1/groups/{handle}": group,
        "/api/v1/groups/{handle}/redrive": group,
    }
    for method, path in sorted(documented):
        query = "?state=queued" if path.endswith("/rows") else ""
        token = PAYLOAD if path.endswith("/payload") else OPERATOR
        url = path.replace("{handle}", handles.get(path, ""))
        status, _ = console.call(method, url + query, minimal.get(path), token=token)
        assert status == 200, (method, path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "at least one token"),
        ("a:admin:" + "x" * 30, "role must be viewer, operator or payload"),
        ("a:viewer:short", "at least 24 characters"),
        ("a:viewer", "expected name:role:token"),
        (f"a:viewer:{VIEWER},a:operator:{OPERATOR}", "names must be unique"),
        (f"a:viewer:{VIEWER},b:operator:{VIEWER}", "two console tokens are equal"),
    ],
)
def test_token_configuration_is_checked(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Tokens.parse(text)


def test_a_token_maps_to_its_name_and_role() -> None:
    tokens = Tokens.parse(f"vera:viewer:{VIEWER},olga:operator:{OPERATOR}")
    found = tokens.authenticate(OPERATOR)
    assert found is not None
    assert (found.name, found.role) == ("olga", Role.OPERATOR)
    assert tokens.authenticate(OPERATOR[:-1]) is None
    assert not Role.VIEWER.allows(Role.OPERATOR)


def test_the_payload_role_is_a_viewer_that_may_read_payloads_and_nothing_more() -> None:
    assert [Role.PAYLOAD.allows(r) for r in (Role.VIEWER, Role.PAYLOAD, Role.OPERATOR)] == [
        True,
        True,
        False,
    ]
    assert not Role.OPERATOR.allows(Role.PAYLOAD)
    assert not Role.VIEWER.allows(Role.PAYLOAD)


@pytest.mark.slow
def test_the_command_serves_the_api_until_terminated(
    db_url: str, tmp_path: Path, console_tokens_file: Path
) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(CONFIG)
    port = free_port()
    env = {
        **os.environ,
        "FENCEBRIDGE_DATABASE_URL": db_url,
        "FENCEBRIDGE_IDENTITY_KEY": "console-command-identity-key-0123456789",
        "FENCEBRIDGE_CONSOLE_TOKENS_FILE": str(console_tokens_file),
    }
    env.pop("FENCEBRIDGE_CONSOLE_TOKENS", None)
    command = [sys.executable, "-m", "bridge", "console", "--config", str(config)]
    with subprocess.Popen(
        [*command, "--port", str(port)], env=env, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip().endswith(f"127.0.0.1:{port}/api/v1/")
            status, body = Console(port, [], []).call("GET", "/api/v1/counts", token=VIEWER)
            assert (status, body["counts"]) == (200, [])
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


@pytest.fixture
def console_tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"# on-call\nvera:viewer:{VIEWER}\n\nolga:operator:{OPERATOR}\n")
    return path


CONTRACT = schemathesis.openapi.from_dict(document())


@CONTRACT.parametrize()
@settings(
    max_examples=CONTRACT_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_every_answer_keeps_the_openapi_contract(console: Console, case: Case) -> None:
    """Schemathesis's generated requests, valid and invalid, each answered as documented: no
    server error, a documented status and content type, a body that fits its schema, 405 for
    an undocumented method, 4xx for invalid input. Not checked: that every schema-valid request
    is accepted, since a cursor is opaque (any string fits its schema; only one the server
    handed out is accepted)."""
    case.call_and_validate(
        base_url=f"http://127.0.0.1:{console.port}",
        headers={"Authorization": f"Bearer {OPERATOR}"},
        excluded_checks=[positive_data_acceptance],
    )


def payload_views(db: Db) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT tenant_id, operation_id, actor, reason, from_state FROM redrive_audit"
        " WHERE to_state = 'payload_viewed' ORDER BY id"
    ).fetchall()


def test_the_checks_are_the_go_no_go_checks_report(console: Console, db_url: str) -> None:
    status, checks = console.call("GET", "/api/v1/checks", token=VIEWER)
    report = check_of(db_url)()

    assert status == 200
    assert [(f["job_type"], f["control"], f["go"], f["evidence"]) for f in checks["findings"]] == [
        (f.job_type, f.control.number, f.verdict.go, f.verdict.evidence) for f in report.findings
    ]
    assert checks["job_types"] == ["charge", "mail"]
    assert len(checks["findings"]) == 20
    # the test configuration names no owner (7) and no retention plan (9)
    assert (checks["go"], checks["summary"]) == (
        False,
        "NO-GO: 4 control(s) fail (charge: 7, 9; mail: 7, 9)",
    )


def test_a_viewer_or_an_operator_cannot_read_a_payload(console: Console, db: Db) -> None:
    body = {"tenant_id": TENANTS[0], "operation_id": "op-raw-0-0", "reason": "INC-7"}
    for token in (VIEWER, OPERATOR):
        status, problem = console.call("POST", "/api/v1/payload", body, token=token)
        assert status == 403, problem
        assert PAYLOAD_MARK.encode() not in console.bodies[-1]
    assert payload_views(db) == []


def test_a_payload_holder_reads_one_payload_with_a_reason_and_the_view_is_audited(
    console: Console, db: Db
) -> None:
    tenant, op = TENANTS[0], "op-raw-0-0"
    key = {"tenant_id": tenant, "operation_id": op}
    status, problem = console.call("POST", "/api/v1/payload", key, token=PAYLOAD)
    assert (status, "reason is required" in problem["detail"]) == (400, True)
    assert payload_views(db) == []

    status, view = console.call(
        "POST", "/api/v1/payload", {**key, "reason": "INC-7: what was sent"}, token=PAYLOAD
    )

    assert status == 200
    stored = json.dumps({"card": PAYLOAD_MARK, "op": op})
    assert (view["payload_text"], view["bytes"]) == (stored, len(stored))
    assert (view["operation"], view["viewed_by"]) == (HASHER.operation(tenant, op), "pia")
    assert payload_views(db) == [(tenant, op, "pia", "INC-7: what was sent", "succeeded")]
    status, found = console.call("POST", "/api/v1/operation", key, token=VIEWER)
    assert [(v["actor"], v["reason"]) for v in found["payload_views"]] == [
        ("pia", "INC-7: what was sent")
    ]
    assert found["redrives"] == []


def test_no_payload_and_no_audit_for_an_operation_without_a_row(console: Console, db: Db) -> None:
    body = {"tenant_id": TENANTS[0], "operation_id": "op-nobody", "reason": "look"}
    status, problem = console.call("POST", "/api/v1/payload", body, token=PAYLOAD)

    assert (status, problem["title"]) == (404, "not found")
    assert payload_views(db) == []
