"""The console's HTML pages: the same reads and the same redrive as ``/api/v1``, for a browser.

Every page is rendered on the server from the JSON API's own answers (:class:`ConsoleApi`), so
a page cannot show what the API would not: tenants and operations as keyed hashes, never
payload bytes. Jinja2 renders with autoescaping on; the pages carry no script at all, and their
Content-Security-Policy allows only the console's own stylesheet.

Authentication: ``POST /login`` takes a console token and answers a session cookie
(``HttpOnly``, ``SameSite=Strict``, ``Path=/``, ``Secure`` unless the console is bound to
loopback) holding a random id; the principal stays on the server (:mod:`.sessions`).

Cookies are read strictly (``name=value`` pairs whose values look like what the console issues;
nothing is unquoted) and written only with values the console made, so no header a browser
sends can reach a header the console answers.

CSRF: every state-changing form carries the session's CSRF token in a hidden field, compared in
constant time; a POST without it or with another is refused 403. The login form, before any
session exists, is protected by a double-submit token: ``GET /login`` sets a random value in a
``SameSite=Strict`` cookie and the same value in the form, and ``POST /login`` needs both to
agree (a cross-site page can neither read nor send that cookie) and the value to be one this
console issued and nobody used yet. Failed logins are throttled per address and logged
(:mod:`.throttle`). In addition every POST whose
browser says where it came from (``Sec-Fetch-Site``, ``Origin``) must come from the console's
own origin.

Behind a trusted authenticating proxy the user comes from the proxy's header instead of a
login: a GET opens a session for that user (a session whose user differs from the header's is
replaced), so the forms still carry a CSRF token; a POST needs the session of the same user.

Payload bytes appear on one page only: the answer to ``POST /payload``, which a holder of the
payload role reaches from the operation page with a reason; the view is audited before the
page is rendered, and the form names the operation by a server-side handle.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

from bridge.console import act_pages, oncall_pages
from bridge.console.api import WINDOW_DEFAULT, WINDOWS, ConsoleApi
from bridge.console.auth import Principal, Role, Tokens
from bridge.console.page_types import PageAnswer, PageError, PageRequest, form_field
from bridge.console.present import age, chart, lookup_reason, when
from bridge.console.problems import ApiError, Request
from bridge.console.sessions import TOKEN_SHAPE, Selection, Session, Sessions, SessionsFullError
from bridge.console.throttle import Throttle

SESSION_COOKIE = "fencebridge_session"
LOGIN_COOKIE = "fencebridge_login"
#: the pages' policy: the console's own script (local times) and stylesheet, nothing inline
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_REDRIVABLE = ("unknown", "quarantined")


PageHandler = Callable[["ConsolePages", PageRequest, Session], PageAnswer]


@dataclass(frozen=True, slots=True)
class PageRoute:
    method: str
    path: str
    role: Role
    handler: PageHandler


class ConsolePages:
    """The pages over one :class:`ConsoleApi`, the console's tokens and its sessions."""

    def __init__(
        self,
        api: ConsoleApi,
        tokens: Tokens,
        sessions: Sessions,
        *,
        secure_cookies: bool,
        throttle: Throttle | None = None,
    ) -> None:
        self._api = api
        self._throttle = throttle or Throttle()
        self._tokens = tokens
        self._sessions = sessions
        self._secure = secure_cookies
        self._env = Environment(
            loader=PackageLoader("bridge.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters["when"] = when
        self._env.filters["age"] = age
        static = resources.files("bridge.console").joinpath("static")
        self._css = static.joinpath("console.css").read_bytes()
        self._js = static.joinpath("console.js").read_bytes()
        self._routes: dict[str, dict[str, PageRoute]] = {}
        for route in PAGE_ROUTES:
            self._routes.setdefault(route.path, {})[route.method] = route

    @property
    def api(self) -> ConsoleApi:
        return self._api

    def render(
        self, code: int, template: str, session: Session | None, **values: Any
    ) -> PageAnswer:
        return self._render(code, template, session, **values)

    # -- dispatch ------------------------------------------------------------------------------

    def answer(self, request: PageRequest) -> PageAnswer:
        """The page for ``request``: a refusal is a page too, with its status."""
        session: Session | None = None
        try:
            static = self._static(request)
            if static is not None:
                return static
            if request.path == "/login" and request.proxied is None:
                return self._login(request)
            session, opened = self._session(request)
            if request.path == "/login":  # behind the proxy: there is nothing to log in to
                return self._with_cookie(_redirect("/"), opened)
            if session is None:
                if request.method == "GET":
                    return _redirect("/login")
                raise PageError(401, "not logged in", "log in first")
            by_method = self._routes.get(request.path) or self._routes.get(_pattern(request.path))
            if by_method is None:
                raise PageError(404, "not found", "there is no such page")
            route = by_method.get(request.method)
            if route is None:
                raise PageError(405, "method not allowed", f"use {', '.join(sorted(by_method))}")
            if request.method == "POST":
                self._same_origin(request)
                if not session.csrf_matches(form_field(request.form, "csrf")):
                    raise PageError(403, "forbidden", "the form's CSRF token is missing or wrong")
            if not session.principal.role.allows(route.role):
                raise PageError(
                    403, "forbidden", f"the {session.principal.role.value} role cannot do this"
                )
            return self._with_cookie(route.handler(self, request, session), opened)
        except (ApiError, PageError) as exc:
            return self._error(exc.status, exc.title, exc.detail, session)

    def _static(self, request: PageRequest) -> PageAnswer | None:
        """The console's stylesheet and script."""
        if request.method != "GET":
            return None
        if request.path == "/static/console.css":
            return PageAnswer(200, self._css, "text/css; charset=utf-8")
        if request.path == "/static/console.js":
            return PageAnswer(200, self._js, "text/javascript; charset=utf-8")
        return None

    def _session(self, request: PageRequest) -> tuple[Session | None, Session | None]:
        """The request's session, and the one opened for it now (to set in a cookie).

        Behind the proxy the header's user decides: a session of another user is dropped, and
        a GET opens one for the user; a POST must arrive with the user's session (its CSRF
        token was issued to it)."""
        session = self._sessions.from_cookie(_cookies(request.cookie_header).get(SESSION_COOKIE))
        user = request.proxied
        if user is None:
            return session, None
        if session is not None and session.principal != user:
            self._sessions.drop(session.id)
            session = None
        if session is None and request.method == "GET":
            opened = self._open(user)
            return opened, opened
        return session, None

    def _with_cookie(self, answer: PageAnswer, opened: Session | None) -> PageAnswer:
        if opened is not None:
            answer.headers.append(self._session_cookie(opened))
        return answer

    def refusal(self, error: PageError, cookie_header: str) -> PageAnswer:
        """``error`` as a page, for what the server refuses before a page is chosen."""
        session = self._sessions.from_cookie(_cookies(cookie_header).get(SESSION_COOKIE))
        return self._error(error.status, error.title, error.detail, session)

    def _same_origin(self, request: PageRequest) -> None:
        """A browser's word on where a form came from must be this console. Under the pages'
        ``no-referrer`` policy a browser sends ``Origin: null``; ``Sec-Fetch-Site`` then
        decides. A client that sends neither (not a browser) still needs the CSRF token."""
        scheme = "https" if self._secure else "http"
        site, origin = request.fetch_site, request.origin
        if site is not None and site != "same-origin":
            raise PageError(403, "forbidden", "the form was not sent from this console")
        if origin == "null" and site is None:
            raise PageError(403, "forbidden", "the form was not sent from this console")
        if origin not in (None, "null", f"{scheme}://{request.host}"):
            raise PageError(403, "forbidden", "the form was not sent from this console")

    # -- login and logout ----------------------------------------------------------------------

    def _login(self, request: PageRequest) -> PageAnswer:
        if request.method == "GET":
            # a fresh value each time, good once: a second tab loads its own
            nonce = self._sessions.issue_nonce()
            answer = self._render(200, "login.html", None, title="Log in", login_csrf=nonce)
            answer.headers.append(("Set-Cookie", self._cookie(LOGIN_COOKIE, nonce, 600)))
            return answer
        if request.method != "POST":
            raise PageError(405, "method not allowed", "use GET, POST")
        self._same_origin(request)
        wait = self._throttle.wait(request.peer)
        if wait > 0:
            raise PageError(429, "too many attempts", f"try again in {int(wait) + 1} seconds")
        expected = _cookies(request.cookie_header).get(LOGIN_COOKIE)
        presented = form_field(request.form, "login_csrf")
        if (
            not expected
            or not presented
            or not secrets.compare_digest(expected, presented)
            or not self._sessions.take_nonce(presented)
        ):
            raise PageError(403, "forbidden", "the login form expired: load it again")
        principal = self._tokens.authenticate((form_field(request.form, "token") or "").strip())
        if principal is None:
            self._throttle.failed(request.peer, "login")
            nonce = self._sessions.issue_nonce()
            answer = self._render(
                401, "login.html", None, title="Log in", login_csrf=nonce, refused=True
            )
            answer.headers.append(("Set-Cookie", self._cookie(LOGIN_COOKIE, nonce, 600)))
            return answer
        session = self._open(principal)
        self._throttle.succeeded(request.peer, "login", principal.name, principal.role.value)
        answer = _redirect("/")
        answer.headers.append(self._session_cookie(session))
        answer.headers.append(("Set-Cookie", self._cookie(LOGIN_COOKIE, "", 0)))
        return answer

    def _open(self, principal: Principal) -> Session:
        try:
            return self._sessions.create(principal)
        except SessionsFullError:
            raise PageError(503, "busy", "too many sessions are open: try again later") from None

    def _session_cookie(self, session: Session) -> tuple[str, str]:
        lifetime = int(self._sessions.lifetime)
        value = self._sessions.cookie_value(session)
        return ("Set-Cookie", self._cookie(SESSION_COOKIE, value, lifetime))

    def logout(self, request: PageRequest, session: Session) -> PageAnswer:
        self._sessions.drop(session.id)
        answer = _redirect("/login")
        answer.headers.append(("Set-Cookie", self._cookie(SESSION_COOKIE, "", 0)))
        return answer

    def _cookie(self, name: str, value: str, max_age: int) -> str:
        if value and TOKEN_SHAPE.fullmatch(value) is None:  # only values the console made
            raise ValueError("a cookie value the console did not make")
        secure = "; Secure" if self._secure else ""
        return f"{name}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict{secure}"

    # -- reads ---------------------------------------------------------------------------------

    def overview(self, request: PageRequest, session: Session) -> PageAnswer:
        counts = self._api.counts(_api_request(session, {}))
        groups: dict[tuple[str, str], dict[str, int]] = {}
        for c in counts["counts"]:
            states = groups.setdefault((c["subscription"], c["job_type"]), {})
            for state, n in c["states"].items():
                states[state] = states.get(state, 0) + n
        window = _one(request.query, "window") or WINDOW_DEFAULT
        figures = self._api.figures(_api_request(session, {"window": [window]}))
        times = [p["at"] for p in figures["series"]]
        return self._render(
            200,
            "overview.html",
            session,
            title="Overview",
            states=list(counts["totals"]),
            groups=sorted(groups.items()),
            totals=counts["totals"],
            figures=figures,
            windows=list(WINDOWS),
            charts=[
                chart(
                    name,
                    label,
                    unit=unit,
                    values=[p[name] for p in figures["series"]],
                    times=times,
                    window=figures["window"],
                )
                for name, label, unit in FIGURES
            ],
            awaiting=self._api.awaiting(_api_request(session, {}))["awaiting"],
            **_refresh(request, "/"),
        )

    def checks(self, request: PageRequest, session: Session) -> PageAnswer:
        report = self._api.checks(_api_request(session, {}))
        by_job: dict[str, list[dict[str, Any]]] = {}
        for f in report["findings"]:
            by_job.setdefault(f["job_type"], []).append(f)
        return self._render(
            200, "checks.html", session, title="Go/no-go check", report=report, jobs=by_job
        )

    def unknown(self, request: PageRequest, session: Session) -> PageAnswer:
        return self._queue(request, session, "unknown")

    def quarantined(self, request: PageRequest, session: Session) -> PageAnswer:
        return self._queue(request, session, "quarantined")

    def _queue(self, request: PageRequest, session: Session, state: str) -> PageAnswer:
        filters = _filled(request.query, ("subscription", "job_type"))
        query = {**filters, **_filled(request.query, ("cursor",)), "state": [state]}
        page = self._api.rows(_api_request(session, query))
        following = None
        if page["next_cursor"] is not None:
            following = _query_string({**filters, "cursor": [page["next_cursor"]]})
        return self._render(
            200,
            "queue.html",
            session,
            title=f"Rows {state}",
            state=state,
            rows=page["rows"],
            subscription=_one(filters, "subscription") or "",
            job_type=_one(filters, "job_type") or "",
            next_query=following,
            **_refresh(request, f"/queues/{state}"),
        )

    def rejected(self, request: PageRequest, session: Session) -> PageAnswer:
        filters = _filled(request.query, ("kind", "open"))
        query = {**filters, **_filled(request.query, ("cursor",))}
        page = self._api.rejected(_api_request(session, query))
        following = None
        if page["next_cursor"] is not None:
            following = _query_string({**filters, "cursor": [page["next_cursor"]]})
        return self._render(
            200,
            "rejected.html",
            session,
            title="Rejected deliveries",
            rejected=page["rejected"],
            kind=_one(filters, "kind") or "",
            open_only=_one(filters, "open") == "true",
            next_query=following,
            **_refresh(request, "/rejected"),
        )

    def operation_form(self, request: PageRequest, session: Session) -> PageAnswer:
        return self._render(200, "operation.html", session, title="Find an operation", found=None)

    def operation(self, request: PageRequest, session: Session) -> PageAnswer:
        """One operation, looked up by the raw ids typed into the form; the page shows hashes
        only, and a redrive form that names the row by a server-side handle."""
        tenant, op = form_field(request.form, "tenant_id"), form_field(request.form, "operation_id")
        found = self._api.operation(
            _api_request(session, {}, {"tenant_id": tenant, "operation_id": op})
        )
        return self.show_operation(session, found, tenant, op)

    def show_operation(
        self, session: Session, found: dict[str, Any], tenant: str | None, op: str | None
    ) -> PageAnswer:
        """The operation page of ``found``: its forms name the row by server-side handles,
        each open rejected delivery by its signed handle."""
        handle = payload_handle = None
        row = found["work_row"]
        if session.principal.role.allows(Role.PAYLOAD) and row is not None:
            assert tenant is not None  # the lookup refused a missing one
            assert op is not None
            payload_handle = session.remember(
                Selection(
                    {"tenant_id": tenant, "operation_id": op},
                    f"operation {found['operation']} of tenant {found['tenant']}",
                    purpose="payload",
                )
            )
        if (
            session.principal.role.allows(Role.OPERATOR)
            and row is not None
            and row["state"] in _REDRIVABLE
        ):
            assert tenant is not None  # the lookup refused a missing one
            assert op is not None
            handle = session.remember(
                Selection(
                    {"tenant_id": tenant, "operation_id": op, "states": [row["state"]]},
                    f"operation {found['operation']} of tenant {found['tenant']}",
                )
            )
        return self._render(
            200,
            "operation.html",
            session,
            title="Operation",
            found=found,
            selection=handle,
            payload_selection=payload_handle,
            class_d=row is not None and row["target_class"] == "D",
            delivery_handles={
                r["id"]: self._api.rejected_handle(r["id"])
                for r in found["rejected_deliveries"]
                if r["open"]
            },
            lookup=lookup_reason(found),
        )

    # -- rendering -----------------------------------------------------------------------------

    def _render(
        self, code: int, template: str, session: Session | None, **values: Any
    ) -> PageAnswer:
        html = self._env.get_template(template).render(
            principal=session.principal if session is not None else None,
            csrf=session.csrf if session is not None else None,
            operator=session is not None and session.principal.role.allows(Role.OPERATOR),
            **values,
        )
        return PageAnswer(code, html.encode())

    def _error(self, status: int, title: str, detail: str, session: Session | None) -> PageAnswer:
        return self._render(
            status, "error.html", session, title=title, status=status, detail=detail
        )


#: every page; ``/login`` and the stylesheet are answered before a session is needed
PAGE_ROUTES: tuple[PageRoute, ...] = (
    PageRoute("GET", "/", Role.VIEWER, ConsolePages.overview),
    PageRoute("GET", "/queues/unknown", Role.VIEWER, ConsolePages.unknown),
    PageRoute("GET", "/queues/quarantined", Role.VIEWER, ConsolePages.quarantined),
    PageRoute("GET", "/rejected", Role.VIEWER, ConsolePages.rejected),
    PageRoute("GET", "/operation", Role.VIEWER, ConsolePages.operation_form),
    PageRoute("POST", "/operation", Role.VIEWER, ConsolePages.operation),
    PageRoute("GET", "/checks", Role.VIEWER, ConsolePages.checks),
    PageRoute("POST", "/payload", Role.PAYLOAD, act_pages.payload),
    PageRoute("POST", "/redrive", Role.OPERATOR, act_pages.redrive),
    PageRoute("POST", "/logout", Role.VIEWER, ConsolePages.logout),
    PageRoute("GET", "/operations/*", Role.VIEWER, oncall_pages.operation),
    PageRoute("GET", "/groups", Role.VIEWER, oncall_pages.groups),
    PageRoute("GET", "/groups/*", Role.VIEWER, oncall_pages.group),
    PageRoute("POST", "/groups/redrive", Role.OPERATOR, oncall_pages.group_redrive),
    PageRoute("POST", "/resolve", Role.OPERATOR, oncall_pages.resolve),
)


def _pattern(path: str) -> str:
    """The route pattern of a path that ends in a handle: ``/operations/<h>`` is
    ``/operations/*``."""
    head, _, tail = path.rpartition("/")
    return f"{head}/*" if head in ("/operations", "/groups") and tail else path


#: the figures the overview charts: (series field, label, unit)
FIGURES = (
    ("stalled", "claimed but stalled", "rows"),
    ("oldest_unknown_seconds", "oldest unknown", "s"),
    ("quarantined", "quarantined per bucket", "rows"),
    ("takeovers", "takeovers per bucket", "claims"),
)
#: the auto-refresh periods a page offers, in seconds
REFRESH = (15, 30, 60)


def _refresh(request: PageRequest, path: str) -> dict[str, Any]:
    """A page's refresh: its own URL with every filter kept, and, when ``every`` asks for it,
    the period the page reloads itself at (a ``<meta http-equiv=refresh>``: no script)."""
    kept = {k: [v for v in values if v] for k, values in request.query.items() if k != "every"}
    every_text = _one(request.query, "every") or ""
    every = int(every_text) if every_text in {str(r) for r in REFRESH} else None
    query = _query_string(kept)
    here = f"{path}?{query}" if query else path
    joiner = "&" if query else "?"
    return {
        "refresh_every": every,
        "refresh_here": here,
        "refresh_options": [(r, f"{here}{joiner}every={r}") for r in REFRESH],
    }


def _api_request(session: Session, query: Mapping[str, Sequence[str]], body: Any = None) -> Request:
    return Request(session.principal, query, body)


_COOKIE_NAME = re.compile(r"[A-Za-z0-9_\-]+")


def _cookies(header: str) -> dict[str, str]:
    """The console's cookies in a ``Cookie`` header: plain ``name=value`` pairs whose value has
    the shape of one the console issues; anything else (quoted, escaped, odd) is ignored."""
    found: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and _COOKIE_NAME.fullmatch(name) and TOKEN_SHAPE.fullmatch(value):
            found.setdefault(name, value)
    return found


def _one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _filled(query: Mapping[str, Sequence[str]], names: Sequence[str]) -> dict[str, list[str]]:
    """The named parameters a form filled in: an empty filter field means no filter."""
    return {n: [v for v in query[n] if v] for n in names if any(query.get(n, ()))}


def _query_string(params: Mapping[str, Sequence[str]]) -> str:
    return urlencode([(k, v) for k, values in params.items() for v in values])


def _redirect(location: str) -> PageAnswer:
    return PageAnswer(303, b"", headers=[("Location", location)])
