"""The console pages' sessions and login, without a server: the cookie's flags, the session's
fixed lifetime, and the refusals of a login form that did not come from the console."""

from __future__ import annotations

from typing import cast

import pytest

from bridge.console.api import ConsoleApi
from bridge.console.auth import Principal, Role, Tokens
from bridge.console.page_types import PageAnswer, PageRequest
from bridge.console.pages import PAGE_ROUTES, ConsolePages
from bridge.console.sessions import SELECTIONS_MAX, Selection, Sessions

TOKEN = "operator-token-bbbbbbbbbbbbbbbbbbbbbb"
HOST = "console.example:8091"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pages(sessions: Sessions, *, secure: bool) -> ConsolePages:
    # login and the session checks never reach the API
    return ConsolePages(
        cast(ConsoleApi, None),
        Tokens.parse(f"olga:operator:{TOKEN}"),
        sessions,
        secure_cookies=secure,
    )


def request(method: str, path: str, **fields: object) -> PageRequest:
    values: dict[str, object] = {
        "query": {},
        "form": {},
        "cookie_header": "",
        "origin": None,
        "fetch_site": None,
        "host": HOST,
        **fields,
    }
    return PageRequest(method=method, path=path, **values)  # type: ignore[arg-type]


def cookies(answer: PageAnswer) -> list[str]:
    return [value for name, value in answer.headers if name == "Set-Cookie"]


def log_in(console: ConsolePages, **fields: object) -> PageAnswer:
    (login_cookie,) = cookies(console.answer(request("GET", "/login")))
    nonce = login_cookie.split(";", 1)[0].split("=", 1)[1]
    form = {"login_csrf": [nonce], "token": [TOKEN]}
    return console.answer(
        request("POST", "/login", form=form, cookie_header=f"fencebridge_login={nonce}", **fields)
    )


@pytest.mark.parametrize("secure", [True, False])
def test_the_session_cookie_is_http_only_strict_and_secure_off_loopback(secure: bool) -> None:
    answer = log_in(pages(Sessions(), secure=secure), origin=f"http{'s' * secure}://{HOST}")

    assert (answer.status, ("Location", "/")) == (303, answer.headers[0])
    session_cookie = cookies(answer)[0]
    assert session_cookie.startswith("fencebridge_session=")
    assert "; Path=/; HttpOnly; SameSite=Strict" in session_cookie
    assert session_cookie.endswith("; Secure") is secure
    assert TOKEN not in session_cookie


@pytest.mark.parametrize(
    "fields",
    [
        {"origin": "https://elsewhere.example"},
        {"origin": "null"},
        {"fetch_site": "cross-site"},
        {"fetch_site": "same-site"},
    ],
)
def test_a_login_from_another_origin_is_refused(fields: dict[str, str]) -> None:
    answer = log_in(pages(Sessions(), secure=True), **fields)

    assert answer.status == 403
    assert cookies(answer) == []


def test_a_login_without_its_form_token_is_refused() -> None:
    console = pages(Sessions(), secure=False)
    form = {"login_csrf": ["x" * 43], "token": [TOKEN]}
    for cookie in ("", "fencebridge_login=" + "y" * 43):
        answer = console.answer(request("POST", "/login", form=form, cookie_header=cookie))
        assert answer.status == 403
        assert b"login form expired" in answer.body


def test_a_session_ends_at_its_lifetime_however_busy() -> None:
    clock = Clock()
    sessions = Sessions(lifetime=60, clock=clock)
    session = sessions.create(Principal("olga", Role.OPERATOR))
    clock.now += 59
    assert sessions.get(session.id) is session
    clock.now += 1
    assert sessions.get(session.id) is None
    assert sessions.get("") is None


def test_a_session_remembers_its_newest_selections_only() -> None:
    session = Sessions().create(Principal("olga", Role.OPERATOR))
    handles = [session.remember(Selection({"n": n}, f"#{n}")) for n in range(SELECTIONS_MAX + 1)]

    assert handles[0] not in session.selections
    assert session.selections[handles[-1]].fields == {"n": SELECTIONS_MAX}
    assert session.csrf_matches(session.csrf)
    assert not session.csrf_matches(None)
    assert not session.csrf_matches(session.csrf[:-1])


def test_every_page_needs_a_session() -> None:
    console = pages(Sessions(), secure=False)
    for route in PAGE_ROUTES:
        answer = console.answer(
            request(route.method, route.path, cookie_header="fencebridge_session=forged")
        )
        if route.method == "GET":
            assert (answer.status, answer.headers) == (303, [("Location", "/login")]), route.path
        else:
            assert answer.status == 401, route.path
