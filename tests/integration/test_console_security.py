"""The console's security findings, each reproduced against a real console over real HTTP and
a real database, and each refused: header injection through the login cookie, the tenant-hash
and payload-hash oracles, sessions capped per user, sign-in throttling and its log, control
characters in audit reasons (the console and ``fencebridge inspect``), proxy-header trust and
the ``Host`` check, idle connections, malformed input, bind addresses, login nonce replay, a
``#`` inside a token of the tokens file, signed cursors and logged raw-id lookups.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import ipaddress
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from bridge import keyring
from bridge.console.auth import Principal, ProxyAuth, Role, Tokens
from bridge.console.server import ConsoleServer
from bridge.console.sessions import SESSIONS_PER_USER, Sessions
from bridge.errors import ConfigError
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, Rejection, State, TargetClass
from tests.integration.test_console_api import (
    HASHER,
    OPERATOR,
    PAYLOAD_MARK,
    TENANTS,
    TOKENS,
    VIEWER,
    Console,
    console_api,
    populate,
)
from tests.integration.test_console_api import console as console  # noqa: PLC0414  (fixture)

Db = psycopg.Connection[Any]
#: how long the tests' consoles give a connection to send a request head
HEAD_SECONDS = 1.0
IDLE_CONNECTIONS = 200
LEASE = timedelta(seconds=60)


@pytest.fixture
def server(store: PostgresStore, db_url: str) -> Iterator[ConsoleServer]:
    keyring.attach(store.keys, HASHER, used_by="test")
    populate(store)
    served = ConsoleServer(
        console_api(store, db_url),
        Tokens.parse(TOKENS),
        "127.0.0.1",
        0,
        head_seconds=HEAD_SECONDS,
    )
    served.start()
    try:
        yield served
    finally:
        served.stop()


def raw(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """What the console answers to ``request`` sent byte for byte, until it closes."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in request:
                head = b"".join(chunks).split(b"\r\n\r\n", 1)[0].lower()
                length = re.search(rb"content-length: (\d+)", head)
                body = b"".join(chunks).split(b"\r\n\r\n", 1)[1]
                if length and len(body) >= int(length.group(1)):
                    break
        return b"".join(chunks)


def call(
    port: int,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        conn.close()


def login_form(port: int) -> tuple[str, str]:
    """A fresh login form's nonce: (the cookie's value, the form's value)."""
    status, headers, body = call(port, "GET", "/login")
    assert status == 200
    cookie = next(c for c in headers.get_all("Set-Cookie") or [] if "fencebridge_login" in c)
    in_cookie = cookie.split(";", 1)[0].split("=", 1)[1]
    found = re.search(rb'name="login_csrf" value="([^"]+)"', body)
    assert found is not None
    return in_cookie, found.group(1).decode()


def log_in(port: int, token: str, nonce: tuple[str, str] | None = None) -> tuple[int, str | None]:
    """POST /login with ``token``: the status and the session cookie set, if any."""
    in_cookie, in_form = nonce or login_form(port)
    status, headers, _ = call(
        port,
        "POST",
        "/login",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"fencebridge_login={in_cookie}",
        },
        body=urlencode({"login_csrf": in_form, "token": token}).encode(),
    )
    session = next(
        (
            c.split(";", 1)[0]
            for c in headers.get_all("Set-Cookie") or []
            if c.startswith("fencebridge_session=") and "Max-Age=0" not in c
        ),
        None,
    )
    return status, session


def page_status(port: int, session: str, path: str = "/checks") -> int:
    return call(port, "GET", path, headers={"Cookie": session})[0]


# -- header injection ----------------------------------------------------------------------------


def test_a_planted_login_cookie_cannot_add_a_header(server: ConsoleServer) -> None:
    """A cookie another site planted, with an escaped CR LF, is not copied into the answer."""
    planted = '"\\015\\012Location: http://evil.example/\\015\\012X-Planted: 1"'
    answer = raw(
        server.port,
        b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        + f"Cookie: fencebridge_login={planted}\r\n\r\n".encode(),
    )
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 200")
    assert "evil.example" not in head
    assert "x-planted" not in head
    assert "\nlocation:" not in head
    (cookie,) = [line for line in head.split("\r\n") if line.startswith("set-cookie:")]
    assert re.fullmatch(r"set-cookie: fencebridge_login=[a-z0-9_\-]{43}; .*", cookie)


# -- oracles -------------------------------------------------------------------------------------


def test_a_lookup_of_ids_without_a_record_tells_no_hash(console: Console) -> None:
    guess = {"tenant_id": "tenant-guessed", "operation_id": "op-guessed"}
    status, body = console.call("POST", "/api/v1/operation", guess, token=VIEWER)

    assert (status, body["title"]) == (404, "not found")
    assert HASHER.tenant("tenant-guessed").encode() not in console.bodies[-1]
    assert HASHER.operation("tenant-guessed", "op-guessed").encode() not in console.bodies[-1]


def test_a_viewer_sees_no_plain_digest_of_a_payload(console: Console, db: Db) -> None:
    payloads = db.execute(
        "SELECT w.tenant_id, w.operation_id, p.body FROM work_item w"
        " JOIN payload p ON p.payload_ref = w.payload_ref"
    ).fetchall()
    shown: dict[str, list[str]] = {}
    for tenant, op, body in payloads:
        status, found = console.call(
            "POST", "/api/v1/operation", {"tenant_id": tenant, "operation_id": op}, token=VIEWER
        )
        assert status == 200
        digest = hashlib.sha256(bytes(body)).hexdigest()
        assert digest.encode() not in console.bodies[-1]
        shown.setdefault(found["work_row"]["payload_hash"], []).append(tenant)
    # equal payloads of two tenants do not look equal
    assert all(len(set(tenants)) == 1 for tenants in shown.values())


# -- sessions and sign-in ------------------------------------------------------------------------


def test_one_users_logins_end_only_their_own_sessions(server: ConsoleServer) -> None:
    port = server.port
    status, operator = log_in(port, OPERATOR)
    assert status == 303
    assert operator is not None
    viewer_sessions = [log_in(port, VIEWER)[1] for _ in range(3 * SESSIONS_PER_USER)]

    assert page_status(port, operator) == 200
    assert [page_status(port, s) for s in viewer_sessions if s is not None][
        -SESSIONS_PER_USER:
    ] == [200] * SESSIONS_PER_USER
    assert page_status(port, str(viewer_sessions[0])) == 303  # the oldest ended: to /login


def test_a_thousand_logins_of_one_user_leave_the_others_alone() -> None:
    sessions = Sessions()
    operator = sessions.create(Principal("olga", Role.OPERATOR))
    for _ in range(1000):
        sessions.create(Principal("vera", Role.VIEWER))

    assert sessions.get(operator.id) is operator
    assert sessions.of("vera") == SESSIONS_PER_USER


def test_guessing_is_throttled_and_every_sign_in_is_logged(
    server: ConsoleServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.console.auth")
    port = server.port
    statuses = [log_in(port, "guess-" + "x" * 30)[0] for _ in range(5)]
    assert statuses == [401] * 5
    # locked out now, even with the right token; the API refuses the same address too
    assert log_in(port, OPERATOR)[0] == 429
    status, headers, _ = call(
        port, "GET", "/api/v1/counts", headers={"Authorization": f"Bearer {OPERATOR}"}
    )
    assert status == 429
    assert int(headers["Retry-After"]) > 0

    messages = [r.getMessage() for r in caplog.records if r.name == "bridge.console.auth"]
    assert sum("sign-in refused from 127.0.0.1" in m for m in messages) == 5
    assert any("locked out" in m for m in messages)
    assert not any(OPERATOR in m for m in messages)


def test_bearer_guesses_are_throttled(server: ConsoleServer) -> None:
    wrong = {"Authorization": "Bearer " + "w" * 40}
    statuses = [call(server.port, "GET", "/api/v1/counts", headers=wrong)[0] for _ in range(6)]
    assert statuses == [401] * 5 + [429]


def test_a_successful_login_is_logged_with_its_user(
    server: ConsoleServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.console.auth")
    assert log_in(server.port, VIEWER)[0] == 303
    assert any("vera (viewer) signed in from 127.0.0.1" in r.getMessage() for r in caplog.records)


def test_a_login_nonce_is_good_once(server: ConsoleServer) -> None:
    nonce = login_form(server.port)
    assert log_in(server.port, VIEWER, nonce)[0] == 303
    status, session = log_in(server.port, VIEWER, nonce)
    assert (status, session) == (403, None)
    # a value the console never issued, in both places, is refused too
    made_up = ("m" * 43, "m" * 43)
    assert log_in(server.port, VIEWER, made_up)[0] == 403


# -- control characters --------------------------------------------------------------------------

HOSTILE_REASONS = ["line\r\nInjected: yes", "colour \x1b[31mred", "bidi \u202e", "nul \x00"]


@pytest.mark.parametrize("reason", HOSTILE_REASONS)
def test_a_reason_with_control_characters_is_refused(console: Console, reason: str, db: Db) -> None:
    body = {"reason": reason, "dry_run": False, "states": ["unknown"]}
    status, problem = console.call("POST", "/api/v1/redrive", body)

    assert status == 400
    assert "reason" in problem["detail"]
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)


def test_inspect_prints_a_stored_reason_without_its_control_characters(
    store: PostgresStore, db: Db, db_url: str
) -> None:
    populate(store)
    tenant, op = TENANTS[0], "op-raw-0-0"
    db.execute(
        "INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state,"
        " to_state, fence, attempts) VALUES ('old\x1b[2J', %s, %s, %s, 'unknown',"
        " 'queued', 1, 1)",
        ("before the check\r\n\x1b[31mFAKE LINE", tenant, op),
    )
    env = {**os.environ, "FENCEBRIDGE_DATABASE_URL": db_url}
    shown = subprocess.run(
        [sys.executable, "-m", "bridge", "inspect", tenant, op],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert "\r" not in shown.stdout
    assert not any(line.startswith("\x1b[31mFAKE") for line in shown.stdout.splitlines())
    assert "before the check\\x0d\\x0a\\x1b[31mFAKE LINE" in shown.stdout


@pytest.mark.slow
def test_the_redrive_command_refuses_a_reason_with_control_characters(db_url: str) -> None:
    env = {**os.environ, "FENCEBRIDGE_DATABASE_URL": db_url}
    refused = subprocess.run(
        [sys.executable, "-m", "bridge", "redrive", "--config", "x.toml", "--reason", "a\nb"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "control characters" in refused.stderr


# -- proxy and Host ------------------------------------------------------------------------------


def test_a_host_that_is_not_the_console_is_refused(server: ConsoleServer) -> None:
    token = {"Authorization": f"Bearer {VIEWER}"}
    status, _, _ = call(server.port, "GET", "/api/v1/counts", headers={**token})
    assert status == 200
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example"):
        status, _, _ = call(server.port, "GET", "/api/v1/counts", headers={**token, "Host": host})
        assert status == 400, host
    assert call(server.port, "GET", "/login", headers={"Host": "rebound.example"})[0] == 400


def test_a_repeated_proxy_user_header_is_refused(store: PostgresStore, db_url: str) -> None:
    keyring.attach(store.keys, HASHER, used_by="test")
    proxy = ProxyAuth(
        "X-Forwarded-Email",
        {"ana@example.com": Role.OPERATOR, "vic@example.com": Role.VIEWER},
        (ipaddress.ip_network("127.0.0.1/32"),),
    )
    served = ConsoleServer(
        console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0, proxy=proxy
    )
    served.start()
    try:
        answer = raw(
            served.port,
            b"GET /api/v1/counts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"X-Forwarded-Email: vic@example.com\r\nX-Forwarded-Email: ana@example.com\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 401")
        assert b"repeated" in answer
    finally:
        served.stop()


def test_loopback_is_not_a_trusted_proxy_unless_listed() -> None:
    env = {
        "FENCEBRIDGE_CONSOLE_PROXY_HEADER": "X-Forwarded-Email",
        "FENCEBRIDGE_CONSOLE_PROXY_ROLES": "ana@example.com:operator",
    }
    with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
        ProxyAuth.from_env(env, host="127.0.0.1")


# -- connections and input -----------------------------------------------------------------------


def test_idle_connections_are_closed_and_do_not_starve_requests(server: ConsoleServer) -> None:
    idle = [
        socket.create_connection(("127.0.0.1", server.port), timeout=30)
        for _ in range(IDLE_CONNECTIONS)
    ]
    try:
        # half of them started a request head and stopped
        for sock in idle[::2]:
            sock.sendall(b"GET /api/v1/counts HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        token = {"Authorization": f"Bearer {VIEWER}"}
        assert call(server.port, "GET", "/api/v1/counts", headers=token)[0] == 200
        # each is closed by the console (recv sees the end) within its head timeout
        deadline = time.monotonic() + HEAD_SECONDS + 20
        for sock in idle:
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            assert sock.recv(1024) == b""
    finally:
        for sock in idle:
            sock.close()


MALFORMED: list[tuple[str, str, bytes | None]] = [
    ("GET", "/api/v1/rows?state=queued&subscription=%00", None),
    ("GET", "/api/v1/rows?state=queued&job_type=a%0D%0Ab", None),
    ("GET", "/api/v1/rows?state=queued&limit=%C2%B2", None),
    ("GET", "/api/v1/rows?state=queued&limit=%D9%A3", None),
    ("POST", "/api/v1/operation", b'{"tenant_id": "\\ud800", "operation_id": "x"}'),
    ("POST", "/api/v1/operation", b'{"tenant_id": "a\\u0000", "operation_id": "x"}'),
    ("POST", "/api/v1/operation", b'{"tenant_id": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("POST", "/api/v1/redrive", b"[" * 60000),
]


@pytest.mark.parametrize(("method", "path", "body"), MALFORMED)
def test_malformed_input_is_answered_4xx(
    console: Console, method: str, path: str, body: bytes | None
) -> None:
    status, problem = console.call(method, path, body)
    assert 400 <= status < 500, problem
    assert problem["status"] == status


def test_a_lone_surrogate_in_a_url_is_read_as_a_replacement_character(console: Console) -> None:
    """Percent-encoded bytes that are no UTF-8 decode to U+FFFD: a filter that matches nothing,
    not a failure."""
    status, page = console.call("GET", "/api/v1/rows?state=queued&subscription=%ED%A0%80")
    assert (status, page["rows"]) == (200, [])


@pytest.mark.parametrize(
    "path", ["/queues/unknown?subscription=%00", "/queues/unknown?job_type=%1B%5B2J"]
)
def test_malformed_page_filters_are_answered_4xx(server: ConsoleServer, path: str) -> None:
    session = log_in(server.port, VIEWER)[1]
    assert session is not None
    assert page_status(server.port, session, path) == 400


@pytest.mark.parametrize(
    "line", [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /\x00 HTTP/1.1\r\n\r\n"]
)
def test_a_malformed_request_line_is_answered_400(server: ConsoleServer, line: bytes) -> None:
    answer = raw(server.port, line)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]


# -- bind addresses ------------------------------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_console_serves_on_ipv6_loopback(store: PostgresStore, db_url: str) -> None:
    keyring.attach(store.keys, HASHER, used_by="test")
    served = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "::1", 0)
    served.start()
    try:
        answer = raw(
            served.port,
            b"GET /api/v1/counts HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n"
            + f"Authorization: Bearer {VIEWER}\r\n\r\n".encode(),
            host="::1",
        )
        assert answer.startswith(b"HTTP/1.1 200")
    finally:
        served.stop()


def test_a_console_on_every_address_warns(
    store: PostgresStore, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bridge.console.server")
    served = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "0.0.0.0", 0)
    served.stop()
    assert any("bound to every address" in r.getMessage() for r in caplog.records)


# -- tokens, cursors and lookups -----------------------------------------------------------------


def test_a_hash_inside_a_token_of_the_tokens_file_is_part_of_it() -> None:
    token = "abc#def-" + "x" * 30
    tokens = Tokens.parse(f"# on-call\nvera:viewer:{token}\n  # a comment\n", separator="\n")
    found = tokens.authenticate(token)
    assert found is not None
    assert found.name == "vera"
    assert tokens.authenticate("abc") is None


def test_a_cursor_the_console_did_not_sign_is_refused(console: Console) -> None:
    forged = base64.urlsafe_b64encode(b"rows:0").decode().rstrip("=")
    status, problem = console.call("GET", f"/api/v1/rows?state=queued&cursor={forged}")
    assert (status, "bad cursor" in problem["detail"]) == (400, True)
    # a genuine cursor of another list is refused as well
    status, page = console.call("GET", "/api/v1/rejected?limit=1")
    assert page["next_cursor"]
    status, problem = console.call("GET", f"/api/v1/rows?state=queued&cursor={page['next_cursor']}")
    assert status == 400


def test_a_lookup_by_raw_ids_is_logged_with_its_actor_and_hash(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.console.audit")
    tenant, op = TENANTS[0], "op-raw-0-0"
    console.call(
        "POST", "/api/v1/operation", {"tenant_id": tenant, "operation_id": op}, token=VIEWER
    )

    (line,) = [r.getMessage() for r in caplog.records if r.name == "bridge.console.audit"]
    assert line == f"console lookup by vera of operation {HASHER.operation(tenant, op)}: found"
    assert tenant not in line
    assert PAYLOAD_MARK not in json.dumps([r.getMessage() for r in caplog.records])


# -- hostile data on the new pages ---------------------------------------------------------------

HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def test_hostile_data_on_the_on_call_pages_is_escaped(store: PostgresStore, db_url: str) -> None:
    """An outcome code, a rejection reason and an audit reason holding markup show as text on
    the overview, the failure groups, a group and an operation page (no element made of it)."""
    keyring.attach(store.keys, HASHER, used_by="test")
    populate(store)
    hostile = Delivery(
        tenant_id=TENANTS[0],
        operation_id="op-hostile",
        subscription="orders",
        job_type="charge",
        target_class=TargetClass.C,
        payload=b"{}",
        max_attempts=1,
    )
    store.inbox.ingest([hostile])
    (claim,) = store.claims.claim_keys("worker-1", [hostile.key], LEASE)
    store.settle.settle(Settlement(claim.ticket, State.UNKNOWN, HOSTILE))
    store.inbox.ingest([Rejection(subscription="orders", reason=HOSTILE, body=b"x")])
    served = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0)
    served.start()
    try:
        session = log_in(served.port, OPERATOR)[1]
        assert session is not None
        pages = ["/", "/groups", "/rejected", "/queues/unknown"]
        bodies = [call(served.port, "GET", p, headers={"Cookie": session})[2] for p in pages]
        groups = bodies[1].decode()
        handles = re.findall(r'href="/groups/([^"]+)"', groups)
        rows = re.findall(r'href="/operations/([^"]+)"', bodies[3].decode())
        bodies += [
            call(served.port, "GET", f"/groups/{h}", headers={"Cookie": session})[2]
            for h in handles
        ]
        bodies += [
            call(served.port, "GET", f"/operations/{h}", headers={"Cookie": session})[2]
            for h in rows
        ]
    finally:
        served.stop()

    assert len(bodies) > len(pages) + 2
    assert HOSTILE.encode() not in b"".join(bodies)
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in b"".join(bodies)
    assert not any(b"<script>" in b for b in bodies)
