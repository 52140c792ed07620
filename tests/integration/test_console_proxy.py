"""Authentication by a trusted proxy's user header, over real HTTP and a real database: the
header's user, with its mapped role, for the API and the pages (the audit's actor is that
user); the same header from a peer that is not a trusted proxy refused, even beside a valid
token."""

from __future__ import annotations

import http.client
import ipaddress
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from bridge import keyring
from bridge.console.auth import ProxyAuth, Role, Tokens
from bridge.console.server import ConsoleServer
from bridge.store import PostgresStore
from tests.integration.test_console_api import (
    HASHER,
    OPERATOR,
    TENANTS,
    TOKENS,
    console_api,
    populate,
)

Db = psycopg.Connection[Any]
HEADER = "X-Forwarded-Email"
ROLES = {"ana@example.com": Role.OPERATOR, "vic@example.com": Role.VIEWER}
Serve = Callable[[ProxyAuth], int]


@pytest.fixture
def serve(store: PostgresStore, db_url: str) -> Iterator[Serve]:
    """Starts a console with the given proxy configuration; answers its port."""
    keyring.attach(store.keys, HASHER, used_by="test")
    populate(store)
    servers: list[ConsoleServer] = []

    def start(proxy: ProxyAuth) -> int:
        server = ConsoleServer(
            console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0, proxy=proxy
        )
        server.start()
        servers.append(server)
        return server.port

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


def call(
    port: int, method: str, path: str, headers: dict[str, str], body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = None if body is None else json.dumps(body)
    sent = {**headers, **({"Content-Type": "application/json"} if data else {})}
    try:
        conn.request(method, path, body=data, headers=sent)
        answer = conn.getresponse()
        # header names as written here, whatever case the server sent them in
        headers = {name.title(): value for name, value in answer.getheaders()}
        return answer.status, headers, answer.read()
    finally:
        conn.close()


#: the proxy beside a console bound to loopback, listed: the peer 127.0.0.1 is that proxy
BESIDE = ProxyAuth(HEADER, ROLES, (ipaddress.ip_network("127.0.0.1/32"),))
#: proxies elsewhere: this test's connections (from 127.0.0.1) do not come from them
ELSEWHERE = ProxyAuth(HEADER, ROLES, (ipaddress.ip_network("10.9.9.9/32"),))


def test_the_trusted_proxys_user_is_the_principal_and_the_audits_actor(
    serve: Serve, db: Db
) -> None:
    port = serve(BESIDE)
    status, _, _ = call(port, "GET", "/api/v1/counts", {HEADER: "vic@example.com"})
    assert status == 200
    request = {"reason": "INC-9", "states": ["unknown"], "tenant_id": TENANTS[0]}
    status, _, _ = call(
        port, "POST", "/api/v1/redrive", {HEADER: "vic@example.com"}, {**request, "dry_run": False}
    )
    assert status == 403  # a viewer

    status, _, body = call(
        port, "POST", "/api/v1/redrive", {HEADER: "Ana@Example.com"}, {**request, "dry_run": False}
    )

    assert status == 200, body
    assert db.execute("SELECT actor, reason FROM redrive_audit").fetchall() == [
        ("Ana@Example.com", "INC-9")
    ]


def test_a_user_the_roles_do_not_name_is_forbidden(serve: Serve) -> None:
    port = serve(BESIDE)
    status, _, body = call(port, "GET", "/api/v1/counts", {HEADER: "mallory@example.com"})
    assert (status, json.loads(body)["detail"]) == (
        403,
        "the proxy's user has no role in this console",
    )


def test_a_forged_header_from_an_untrusted_peer_is_refused_even_with_a_token(
    serve: Serve, db: Db
) -> None:
    port = serve(ELSEWHERE)
    token = {"Authorization": f"Bearer {OPERATOR}"}

    for headers in ({HEADER: "ana@example.com"}, {HEADER: "ana@example.com", **token}):
        status, answer, body = call(port, "GET", "/api/v1/counts", headers)
        assert status == 401, body
        assert "not accepted from this address" in json.loads(body)["detail"]
    status, answer, body = call(port, "GET", "/", {HEADER: "ana@example.com"})
    assert status == 401
    assert "Set-Cookie" not in answer
    assert b"not accepted from this address" in body
    # without the header, the token still works
    assert call(port, "GET", "/api/v1/counts", token)[0] == 200
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)


def test_the_pages_open_a_session_for_the_proxys_user_without_a_login(serve: Serve) -> None:
    port = serve(BESIDE)
    status, answer, body = call(port, "GET", "/", {HEADER: "vic@example.com"})

    assert status == 200
    assert b"vic@example.com (viewer)" in body
    cookie = answer["Set-Cookie"].split(";", 1)[0]
    assert cookie.startswith("fencebridge_session=")
    # the same session serves the next page; /login has nothing to ask
    status, answer, body = call(
        port, "GET", "/checks", {HEADER: "vic@example.com", "Cookie": cookie}
    )
    assert (status, "Set-Cookie" in answer) == (200, False)
    status, answer, _ = call(port, "GET", "/login", {HEADER: "vic@example.com", "Cookie": cookie})
    assert (status, answer["Location"]) == (303, "/")
    # another user behind the proxy does not inherit that session
    status, answer, body = call(port, "GET", "/", {HEADER: "ana@example.com", "Cookie": cookie})
    assert b"ana@example.com (operator)" in body
    assert answer["Set-Cookie"].split(";", 1)[0] != cookie
