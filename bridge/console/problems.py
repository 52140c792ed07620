"""What every route of the API takes (the request, parsed) and how it refuses (an answer
other than 200, with its status, title and reason)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.console.auth import Principal


@dataclass(frozen=True, slots=True)
class Request:
    principal: Principal
    query: Mapping[str, Sequence[str]]
    #: the parsed JSON body of a POST (None for a GET)
    body: Any = None


class ApiError(Exception):
    """An answer other than 200: its status, a short title and the specific reason."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


def bad_request(detail: str) -> ApiError:
    return ApiError(400, "bad request", detail)
