"""The console's HTTP server: authentication, roles, JSON in and out, security headers; and,
outside ``/api/v1``, the HTML pages (:mod:`.pages`) on the same port.

Every answer, an error included, carries the security headers and ``Cache-Control: no-store``.
The order of checks is fixed: a token first (401 before anything is revealed, even whether a
path exists), then the route (404, 405), the role (403), the body's type and size (415, 413),
its JSON (400), and the route's own checks (400). An unexpected exception in a route is answered
500 with its type only and logged by type; the server loop runs as a supervised service, so
nothing a request does can stop it.

The pages answer with the same headers but their own Content-Security-Policy (the console's
stylesheet, nothing else; still no script and ``frame-ancestors 'none'``).

With proxy authentication configured (:class:`~bridge.console.auth.ProxyAuth`), a request that
carries the proxy's user header is that user, for the API and the pages alike, provided the
connection comes from a trusted peer; a header from any other peer is refused 401, whatever
else the request carries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bridge.console.api import PREFIX, ROUTES, ApiError, ConsoleApi, Request, Route
from bridge.console.auth import LOOPBACK_HOSTS, Principal, ProxyAuth, ProxyError, Tokens
from bridge.console.pages import PAGE_POLICY, ConsolePages, PageError, PageRequest
from bridge.console.sessions import Sessions
from bridge.service import Backoff, Deadline, Supervised

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8091
BODY_MAX = 64 * 1024
ROUND_SECONDS = 0.2
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}
#: the pages' headers: the API's, with the policy that lets a page load its stylesheet
PAGE_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": PAGE_POLICY}
#: a console bound here is reached over plain HTTP on the machine itself: no Secure cookies
LOOPBACK = LOOPBACK_HOSTS
#: fields a page's form may carry
FORM_FIELDS_MAX = 50


class ConsoleServer:
    def __init__(
        self,
        api: ConsoleApi,
        tokens: Tokens,
        host: str,
        port: int,
        *,
        sessions: Sessions | None = None,
        proxy: ProxyAuth | None = None,
    ) -> None:
        pages = ConsolePages(
            api, tokens, sessions or Sessions(), secure_cookies=host not in LOOPBACK
        )
        routes: dict[str, dict[str, Route]] = {}
        for route in ROUTES:
            routes.setdefault(route.path, {})[route.method] = route

        class Handler(BaseHTTPRequestHandler):
            server_version = "fencebridge-console"
            sys_version = ""

            def __getattr__(self, name: str) -> Callable[[], None]:
                """Every method reaches :meth:`_answer`: one the route does not take is
                answered 405 with the methods it does, like any other refusal."""
                method = name.removeprefix("do_")
                if name.startswith("do_") and method.isalpha() and method.isupper():
                    return lambda: self._answer(method)
                raise AttributeError(name)

            def send_error(
                self, code: int, message: str | None = None, explain: str | None = None
            ) -> None:
                """What the HTTP layer refuses itself (a malformed request line, an unknown
                method) is answered like the rest: a JSON problem with the security headers."""
                self.close_connection = True
                title = self.responses.get(code, ("error",))[0].lower()
                detail = message or title
                self._send(
                    code,
                    {"type": "about:blank", "title": title, "status": code, "detail": detail},
                    {},
                )

            def _answer(self, method: str) -> None:
                path = urlsplit(self.path).path
                if path != PREFIX and not path.startswith(PREFIX + "/"):
                    self._page(method)
                    return
                extra: dict[str, str] = {}
                try:
                    status, body = 200, self._route(method, extra)
                except ApiError as exc:
                    status = exc.status
                    body = {"type": "about:blank", "title": exc.title, "status": exc.status}
                    body["detail"] = exc.detail
                except Exception as exc:  # noqa: BLE001  (one request fails, the server goes on)
                    log.error("console request failed: %s", type(exc).__name__)
                    status = 500
                    body = {
                        "type": "about:blank",
                        "title": "internal error",
                        "status": 500,
                        "detail": f"the request failed ({type(exc).__name__}); see the log",
                    }
                self._send(status, body, extra)

            def _route(self, method: str, extra: dict[str, str]) -> dict[str, Any]:
                principal = self._principal(extra)
                parts = urlsplit(self.path)
                by_method = routes.get(parts.path)
                if by_method is None:
                    raise ApiError(404, "not found", f"no such route: {parts.path}")
                route = by_method.get(method)
                if route is None:
                    extra["Allow"] = ", ".join(sorted(by_method))
                    raise ApiError(405, "method not allowed", f"use {extra['Allow']}")
                if not principal.role.allows(route.role):
                    raise ApiError(
                        403, "forbidden", f"the {principal.role.value} role cannot do this"
                    )
                try:
                    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
                except ValueError:
                    raise ApiError(
                        400, "bad request", "the query string cannot be parsed"
                    ) from None
                body = self._body() if method == "POST" else None
                return route.handler(api, Request(principal, query, body))

            def _proxied(self) -> Principal | None:
                """The user a trusted proxy names; raises ProxyError for a forged header."""
                if proxy is None:
                    return None
                return proxy.principal(self.headers.get(proxy.header), self.client_address[0])

            def _principal(self, extra: dict[str, str]) -> Principal:
                try:
                    proxied = self._proxied()
                except ProxyError as exc:
                    title = "unauthorized" if exc.status == 401 else "forbidden"
                    raise ApiError(exc.status, title, exc.detail) from None
                if proxied is not None:
                    return proxied
                header = self.headers.get("Authorization", "")
                scheme, _, token = header.partition(" ")
                principal = tokens.authenticate(token.strip()) if scheme == "Bearer" else None
                if principal is None:
                    extra["WWW-Authenticate"] = 'Bearer realm="fencebridge"'
                    detail = (
                        "a bearer token is required" if not header else "the token is not valid"
                    )
                    raise ApiError(401, "unauthorized", detail)
                return principal

            def _body(self) -> Any:
                content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip()
                if content_type.lower() != "application/json":
                    raise ApiError(415, "unsupported media type", "send application/json")
                length_text = self.headers.get("Content-Length", "")
                if not length_text.isdigit():
                    raise ApiError(400, "bad request", "Content-Length is required")
                length = int(length_text)
                if length > BODY_MAX:
                    self.close_connection = True
                    raise ApiError(413, "too large", f"the body is over {BODY_MAX} bytes")
                try:
                    return json.loads(self.rfile.read(length))
                except (ValueError, UnicodeDecodeError):
                    raise ApiError(400, "bad request", "the body is not valid JSON") from None

            def _page(self, method: str) -> None:
                parts = urlsplit(self.path)
                cookie = self.headers.get("Cookie", "")
                try:
                    query = parse_qs(parts.query, keep_blank_values=True)
                    request = PageRequest(
                        method=method,
                        path=parts.path,
                        query=query,
                        form=self._form() if method == "POST" else {},
                        cookie_header=cookie,
                        origin=self.headers.get("Origin"),
                        fetch_site=self.headers.get("Sec-Fetch-Site"),
                        host=self.headers.get("Host", ""),
                        proxied=self._proxied(),
                    )
                    answer = pages.answer(request)
                except ValueError:
                    answer = pages.refusal(
                        PageError(400, "bad request", "the query string cannot be parsed"), cookie
                    )
                except PageError as exc:
                    answer = pages.refusal(exc, cookie)
                except ProxyError as exc:
                    title = "not logged in" if exc.status == 401 else "forbidden"
                    answer = pages.refusal(PageError(exc.status, title, exc.detail), "")
                except Exception as exc:  # noqa: BLE001  (one request fails, the server goes on)
                    log.error("console page failed: %s", type(exc).__name__)
                    answer = pages.refusal(
                        PageError(500, "internal error", "the request failed; see the log"),
                        cookie,
                    )
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                for name, value in [*PAGE_HEADERS.items(), *answer.headers]:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer.body)

            def _form(self) -> dict[str, list[str]]:
                content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip()
                if content_type.lower() != "application/x-www-form-urlencoded":
                    raise PageError(415, "unsupported media type", "send a form")
                length_text = self.headers.get("Content-Length", "")
                if not length_text.isdigit():
                    raise PageError(400, "bad request", "Content-Length is required")
                if int(length_text) > BODY_MAX:
                    self.close_connection = True
                    raise PageError(413, "too large", f"the form is over {BODY_MAX} bytes")
                try:
                    text = self.rfile.read(int(length_text)).decode("utf-8")
                    return parse_qs(text, keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX)
                except ValueError:
                    raise PageError(400, "bad request", "the form cannot be parsed") from None

            def _send(self, status: int, body: dict[str, Any], extra: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                kind = "application/json" if status < 400 else "application/problem+json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for name, value in {**SECURITY_HEADERS, **extra}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Requests are logged by method, path and status, never their query or body."""

            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                path = getattr(self, "path", "")  # unset when the request line was refused
                log.debug("console %s %s %s", self.command or "-", urlsplit(path).path, code)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._server.timeout = ROUND_SECONDS
        self.service = Supervised("console", self._server.handle_request, backoff=Backoff(cap=1.0))

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self.service.start()

    def stop(self, deadline: float | Deadline = 5.0) -> None:
        self.service.stop(deadline)
        self._server.server_close()
