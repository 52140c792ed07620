"""What the API's routes share: the refusals they document, the role each needs, the query
parameters they take alike, and the refusal of a query parameter a route does not take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse

from bridge.console import models as m
from bridge.console.auth import Principal, Role
from bridge.console.problems import ApiError

PROBLEM = "application/problem+json"
TITLES = {
    400: "bad request",
    401: "unauthorized",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    413: "too large",
    415: "unsupported media type",
    429: "too many attempts",
    500: "internal error",
    503: "busy",
}
#: every refusal the API may answer, documented on every route
PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": m.Problem, "description": title, "content": {PROBLEM: {}}}
    for status, title in TITLES.items()
}


def problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    title = TITLES.get(status, "error")
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return JSONResponse(body, status, headers=headers, media_type=PROBLEM)


def role(needed: Role) -> Callable[[Request], Principal]:
    """The request's principal, if its role allows ``needed`` (403 otherwise)."""

    def check(request: Request) -> Principal:
        principal: Principal = request.state.principal
        if not principal.role.allows(needed):
            raise ApiError(403, "forbidden", f"the {principal.role.value} role cannot do this")
        return principal

    return check


Viewer = Annotated[Principal, Depends(role(Role.VIEWER))]
Operator = Annotated[Principal, Depends(role(Role.OPERATOR))]
PayloadReader = Annotated[Principal, Depends(role(Role.PAYLOAD))]
Limit = Annotated[int, Query(ge=1, le=500, description="rows per page")]
Cursor = Annotated[str | None, Query(description="the previous page's next_cursor, unchanged")]
WindowQuery = Annotated[m.Window, Query(description="how far back: 15m, 1h, 6h or 24h")]


def strict_query(request: Request) -> None:
    """A query parameter the route does not take, or one given twice, is refused 400."""
    route = request.scope.get("route")
    known = (
        {p.alias for p in route.dependant.query_params} if isinstance(route, APIRoute) else set()
    )
    for name in request.query_params:
        if name not in known:
            raise ApiError(400, "bad request", f"unknown query parameter: {name}")
        if len(request.query_params.getlist(name)) > 1:
            raise ApiError(400, "bad request", f"{name} given more than once")


STRICT = [Depends(strict_query)]
