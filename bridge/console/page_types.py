"""What a page handler takes and answers: the request as the server parsed it, the page, and
a refusal rendered as a page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from bridge.console.auth import Principal

if TYPE_CHECKING:
    from bridge.console.api import ConsoleApi
    from bridge.console.sessions import Session


@dataclass(frozen=True, slots=True)
class PageRequest:
    """What a page needs of an HTTP request, already parsed by the server."""

    method: str
    path: str
    query: Mapping[str, Sequence[str]]
    #: the url-encoded form of a POST (empty for a GET)
    form: Mapping[str, Sequence[str]]
    cookie_header: str
    #: the ``Origin`` and ``Sec-Fetch-Site`` headers, when the browser sent them
    origin: str | None
    fetch_site: str | None
    host: str
    #: the user a trusted proxy named in its header (already checked), if any
    proxied: Principal | None = None
    #: the connection's peer address (failed logins are throttled by it)
    peer: str = ""


@dataclass(slots=True)
class PageAnswer:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


class PageError(Exception):
    """A refusal rendered as a page: its status, a title and the reason."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


def form_field(form: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = form.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise PageError(400, "bad request", f"{name} given more than once")
    return values[0]


class ConsolePages(Protocol):
    """What the page modules use of :class:`~bridge.console.pages.ConsolePages`."""

    @property
    def api(self) -> ConsoleApi: ...

    def render(
        self, code: int, template: str, session: Session | None, **values: Any
    ) -> PageAnswer: ...

    def show_operation(
        self, session: Session, found: dict[str, Any], tenant: str | None, op: str | None
    ) -> PageAnswer: ...
