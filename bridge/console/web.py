"""The console as an ASGI application (FastAPI on Starlette): the ``/api/v1`` routes with their
models and OpenAPI document from one definition (:mod:`.models`), and the HTML pages
(:mod:`.pages`) on the same app.

Around the routes, in this order from the outside: the security headers on every answer (the
pages' own Content-Security-Policy on pages), the ``Host`` check, a last net that answers any
unexpected failure 500 by its type only, and the API's gate: a token or a trusted proxy's user
first (401 before anything is revealed, even whether a path exists; failed attempts throttled),
then a POST's type (415) and size (413). Routing (404, 405), the role (403) and the models'
validation (400, never 422) follow. Request parsing, keep-alive and timeouts are uvicorn's
(:mod:`.server`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge.console import models as m
from bridge.console import oncall_routes
from bridge.console.api import PREFIX, ROUTES, ConsoleApi
from bridge.console.auth import Principal, ProxyAuth, ProxyError, Tokens
from bridge.console.page_types import PageError, PageRequest
from bridge.console.pages import PAGE_POLICY, PAGE_ROUTES, ConsolePages
from bridge.console.problems import ApiError
from bridge.console.problems import Request as ApiRequest
from bridge.console.routing import (
    PROBLEM,
    PROBLEMS,
    STRICT,
    TITLES,
    Cursor,
    Limit,
    Operator,
    PayloadReader,
    Viewer,
    WindowQuery,
    problem,
)
from bridge.console.throttle import Throttle

log = logging.getLogger("bridge.console.server")

BODY_MAX = 64 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}
#: the pages' headers: the API's, with the policy that lets a page load its stylesheet
PAGE_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": PAGE_POLICY}
FORM_FIELDS_MAX = 50
#: the API paths that take a POST (and so a JSON body); a POST elsewhere is a 404 or 405
POSTS = frozenset(r.path for r in ROUTES if r.method == "POST" and "{" not in r.path)


def _is_api(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


# -- the layers around the routes ----------------------------------------------------------------


class Headers:
    """The security headers on every answer, whatever answered it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = SECURITY_HEADERS if _is_api(scope["path"]) else PAGE_HEADERS

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *[
                        (k.lower().encode(), v.encode())
                        for k, v in extra.items()
                        if k.lower().encode() not in have
                    ],
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


class LastNet:
    """An unexpected failure of one request is answered 500, logged by its type only (its text
    may hold identifiers); the server goes on."""

    def __init__(self, app: ASGIApp, pages: ConsolePages) -> None:
        self.app = app
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001  (one request fails, the server goes on)
            log.error("console request failed: %s", type(exc).__name__)
            if started or scope["type"] != "http":
                return
            detail = f"the request failed ({type(exc).__name__}); see the log"
            answer: Response
            if _is_api(scope["path"]):
                answer = problem(500, detail)
            else:
                answer = _page(self.pages.refusal(PageError(500, "internal error", detail), ""))
            await answer(scope, receive, send)


class Gate:
    """Who an ``/api/v1`` request is, before anything else is told; and what a POST carries."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: Tokens,
        proxy: ProxyAuth | None,
        throttle: Throttle,
        pages: ConsolePages,
    ) -> None:
        self.app = app
        self.pages = pages
        self.tokens = tokens
        self.proxy = proxy
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._check(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> Response | None:
        headers = _headers(scope)
        peer = _peer(scope)
        if _is_api(scope["path"]):
            try:
                principal = self._principal(headers, peer)
            except ApiError as exc:
                extra = {"WWW-Authenticate": 'Bearer realm="fencebridge"'}
                if exc.status == 429:
                    extra["Retry-After"] = exc.title
                    return problem(429, exc.detail, extra)
                return problem(exc.status, exc.detail, extra if exc.status == 401 else None)
            scope.setdefault("state", {})["principal"] = principal
        else:
            try:
                proxied = self._proxied(headers, peer)
            except ProxyError as exc:
                title = "not logged in" if exc.status == 401 else "forbidden"
                return _page(self.pages.refusal(PageError(exc.status, title, exc.detail), ""))
            scope.setdefault("state", {})["proxied"] = proxied
        if scope["method"] == "POST" and (_posts(scope["path"]) or not _is_api(scope["path"])):
            return _body_refusal(headers, api=_is_api(scope["path"]))
        return None

    def _proxied(self, headers: dict[str, list[str]], peer: str) -> Principal | None:
        if self.proxy is None:
            return None
        return self.proxy.principal(headers.get(self.proxy.header.lower()), peer)

    def _principal(self, headers: dict[str, list[str]], peer: str) -> Principal:
        try:
            proxied = self._proxied(headers, peer)
        except ProxyError as exc:
            raise ApiError(exc.status, "", exc.detail) from None
        if proxied is not None:
            return proxied
        wait = self.throttle.wait(peer)
        if wait > 0:
            raise ApiError(429, str(int(wait) + 1), "too many failed attempts: try again later")
        given = headers.get("authorization", [])
        scheme, _, token = given[0].partition(" ") if len(given) == 1 else ("", "", "")
        principal = self.tokens.authenticate(token.strip()) if scheme == "Bearer" else None
        if principal is None:
            if given:
                self.throttle.failed(peer, "api")
            detail = "a bearer token is required" if not given else "the token is not valid"
            raise ApiError(401, "", detail)
        return principal


def _posts(path: str) -> bool:
    """Whether an API path takes a POST (and so a JSON body)."""
    return path in POSTS or (path.startswith(f"{PREFIX}/groups/") and path.endswith("/redrive"))


def _headers(scope: Scope) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in scope["headers"]:
        found.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return found


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _body_refusal(headers: dict[str, list[str]], *, api: bool) -> Response | None:
    kind = (headers.get("content-type") or [""])[0].split(";", 1)[0].strip().lower()
    wanted = "application/json" if api else "application/x-www-form-urlencoded"
    if kind != wanted:
        return problem(415, "send application/json" if api else "send a form")
    length = headers.get("content-length") or []
    if len(length) != 1 or not (length[0].isascii() and length[0].isdecimal()):
        return problem(400, "Content-Length is required")
    if int(length[0]) > BODY_MAX:
        return problem(413, f"the body is over {BODY_MAX} bytes")
    return None


# -- validation answers ------------------------------------------------------------------------


#: what a validation error of these kinds says, whatever its field
_FIXED = {"json_invalid": "the body is not valid JSON"}


def describe(error: MutableMapping[str, Any]) -> str:
    """One validation error as the reason of a 400."""
    where = error.get("loc", ("",))[0]
    name = ".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "query"))
    kind = str(error.get("type", ""))
    message = str(error.get("msg", "is not valid"))
    if kind in _FIXED:
        text = _FIXED[kind]
    elif not name and kind.endswith("_type"):
        text = "the body must be a JSON object"
    elif kind in ("missing", "extra_forbidden"):
        text = f"{name} is required" if kind == "missing" else f"unknown field: {name}"
    elif kind in ("literal_error", "enum") and where == "query":
        text = f"unknown {name}: expected {message.removeprefix('Input should be ')}"
    elif message.startswith(("must ", "Input should be ")):
        text = f"{name} must {message.removeprefix('must ').removeprefix('Input should ')}"
    else:
        text = f"{name}: {message}"
    return text


# -- the app -------------------------------------------------------------------------------------


def create_app(
    api: ConsoleApi | None,
    pages: ConsolePages | None,
    tokens: Tokens | None,
    *,
    proxy: ProxyAuth | None = None,
    allowed_hosts: list[str] | None = None,
    throttle: Throttle | None = None,
) -> FastAPI:
    """The console's app; ``api`` None builds it for its OpenAPI document only."""
    app = FastAPI(
        title="fencebridge console API",
        version="1",
        description="Parked work, counts, figures, the go/no-go check and redrive. Identifiers "
        "appear as keyed hashes only; payload bytes only in the answer to POST /api/v1/payload "
        "(payload role, audited). Every request needs a bearer token (or, where configured, a "
        "trusted proxy's user header).",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,
        redoc_url=None,
    )

    def console() -> ConsoleApi:
        assert api is not None  # an app for its document only is never served
        return api

    viewer = STRICT

    def query_of(request: Request) -> dict[str, list[str]]:
        return {k: request.query_params.getlist(k) for k in request.query_params}

    @app.get(f"{PREFIX}/counts", response_model=m.Counts, responses=PROBLEMS, dependencies=viewer)
    def counts(request: Request, principal: Viewer) -> dict[str, Any]:
        """row counts by state per subscription, job type and tenant hash"""
        return console().counts(ApiRequest(principal, {}))

    @app.get(f"{PREFIX}/status", response_model=m.Status, responses=PROBLEMS, dependencies=viewer)
    def status(principal: Viewer) -> dict[str, Any]:
        """`fencebridge status`: counts, stalled claims, oldest unknown, rejected awaiting"""
        return console().status(ApiRequest(principal, {}))

    @app.get(f"{PREFIX}/rows", response_model=m.RowPage, responses=PROBLEMS, dependencies=viewer)
    def rows(
        request: Request,
        *,
        state: m.StateName,
        subscription: m.Filter | None = None,
        job_type: m.Filter | None = None,
        limit: Limit = 50,
        cursor: Cursor = None,
        principal: Viewer,
    ) -> dict[str, Any]:
        """rows in one state, oldest first, keyset-paginated"""
        return console().rows(ApiRequest(principal, query_of(request)))

    @app.get(
        f"{PREFIX}/rejected", response_model=m.RejectedPage, responses=PROBLEMS, dependencies=viewer
    )
    def rejected(
        request: Request,
        *,
        kind: m.RejectedKind | None = None,
        open: m.Flag | None = None,
        limit: Limit = 50,
        cursor: Cursor = None,
        principal: Viewer,
    ) -> dict[str, Any]:
        """rejected deliveries (conflicts, quarantined), keyset-paginated"""
        return console().rejected(ApiRequest(principal, query_of(request)))

    @app.post(
        f"{PREFIX}/operation", response_model=m.Operation, responses=PROBLEMS, dependencies=viewer
    )
    def operation(query: m.OperationQuery, principal: Viewer) -> dict[str, Any]:
        """one operation: its row, attempts, redrives and rejected deliveries"""
        return console().operation(ApiRequest(principal, {}, query.model_dump()))

    @app.post(
        f"{PREFIX}/redrive", response_model=m.RedriveReport, responses=PROBLEMS, dependencies=viewer
    )
    def redrive(body: m.RedriveRequest, principal: Operator) -> dict[str, Any]:
        """redrive parked work (operator role), audited with the token's name"""
        fields = body.model_dump(exclude_unset=True)
        return console().redrive(ApiRequest(principal, {}, fields))

    @app.get(f"{PREFIX}/checks", response_model=m.Checks, responses=PROBLEMS, dependencies=viewer)
    def checks(principal: Viewer) -> dict[str, Any]:
        """the nine go/no-go controls per job type, as `fencebridge check`"""
        return console().checks(ApiRequest(principal, {}))

    @app.get(f"{PREFIX}/figures", response_model=m.Figures, responses=PROBLEMS, dependencies=viewer)
    def figures(
        request: Request,
        *,
        window: WindowQuery = "1h",
        principal: Viewer,
    ) -> dict[str, Any]:
        """stalled claims, oldest unknown, quarantines, takeovers over time"""
        return console().figures(ApiRequest(principal, query_of(request)))

    @app.post(
        f"{PREFIX}/payload", response_model=m.Payload, responses=PROBLEMS, dependencies=viewer
    )
    def payload(query: m.PayloadQuery, principal: PayloadReader) -> dict[str, Any]:
        """one operation's payload bytes (payload role), every view audited"""
        return console().payload(ApiRequest(principal, {}, query.model_dump()))

    app.include_router(oncall_routes.router(console))
    _document(app)
    _errors(app, pages)
    if pages is not None:
        _pages(app, pages)
        assert tokens is not None
        app.add_middleware(
            Gate, tokens=tokens, proxy=proxy, throttle=throttle or Throttle(), pages=pages
        )
        app.add_middleware(LastNet, pages=pages)
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])
        app.add_middleware(Headers)
    return app


def _document(app: FastAPI) -> None:
    """The OpenAPI document: FastAPI's, with the bearer scheme, and without the 422 answers
    this API never gives (a validation error is a 400 problem)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            refusal = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
            for item in doc["paths"].values():
                for op in item.values():
                    op["responses"].pop("422", None)
                    for status, answer in op["responses"].items():
                        if int(status) >= 400:
                            answer["content"] = refusal
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _errors(app: FastAPI, pages: ConsolePages | None) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        if not _is_api(request.url.path) and pages is not None:
            return _page(pages.refusal(PageError(exc.status, exc.title, exc.detail), ""))
        return problem(exc.status, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        return problem(400, describe(errors[0]) if errors else "the request is not valid")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        status = exc.status_code
        if status == 405:
            detail = f"use {headers.get('Allow', '')}"
        elif status == 404:
            detail = f"no such route: {request.url.path}"
        else:
            detail = "the request cannot be read" if status == 400 else str(exc.detail)
        if not _is_api(request.url.path) and pages is not None:
            cookie = request.headers.get("cookie", "")
            title = TITLES.get(status, "error")
            answer = _page(pages.refusal(PageError(status, title, detail), cookie))
            answer.headers.update(headers)
            return answer
        return problem(status, detail, headers)


def _pages(app: FastAPI, pages: ConsolePages) -> None:
    async def endpoint(request: Request) -> Response:
        form: dict[str, list[str]] = {}
        if request.method == "POST":
            try:
                text = (await request.body()).decode("utf-8")
                form = parse_qs(text, keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX)
            except ValueError:
                raise PageError(400, "bad request", "the form cannot be parsed") from None
        page = PageRequest(
            method=request.method,
            path=request.url.path,
            query={k: request.query_params.getlist(k) for k in request.query_params},
            form=form,
            cookie_header=request.headers.get("cookie", ""),
            origin=request.headers.get("origin"),
            fetch_site=request.headers.get("sec-fetch-site"),
            host=request.headers.get("host", ""),
            proxied=request.scope.get("state", {}).get("proxied"),
            peer=_peer(request.scope),
        )
        return _page(await run_in_threadpool(pages.answer, page))

    methods: dict[str, set[str]] = {
        "/login": {"GET", "POST"},
        "/static/console.css": {"GET"},
        "/static/console.js": {"GET"},
    }
    for route in PAGE_ROUTES:
        methods.setdefault(route.path.replace("*", "{handle}"), set()).add(route.method)
    for path, allowed in methods.items():
        app.add_route(path, endpoint, methods=sorted(allowed), include_in_schema=False)

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> Response:
        return _page(pages.refusal(exc, request.headers.get("cookie", "")))


def _page(answer: Any) -> Response:
    response = Response(answer.body, answer.status, media_type=None)
    response.headers["Content-Type"] = answer.content_type
    for name, value in answer.headers:
        response.headers.append(name, value)
    return response


Endpoint = Callable[..., Awaitable[Response]]
