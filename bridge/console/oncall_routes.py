"""The on-call routes of ``/api/v1`` (:mod:`.oncall_api`): what awaits a person, an operation
by its handle, failure groups and their redrive, and closing a rejected delivery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query

from bridge.console import models as m
from bridge.console.api import PREFIX, ConsoleApi
from bridge.console.problems import Request as ApiRequest
from bridge.console.routing import PROBLEMS, STRICT, Operator, Viewer

GroupLimit = Annotated[int, Query(ge=1, le=100, description="the group's oldest rows")]


def router(console: Callable[[], ConsoleApi]) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, responses=PROBLEMS, dependencies=STRICT)

    @routes.get("/awaiting", response_model=m.Awaiting)
    def awaiting(principal: Viewer) -> dict[str, Any]:
        """parked and failed rows, open conflicts and quarantined deliveries, oldest age"""
        return console().awaiting(ApiRequest(principal, {}))

    @routes.get("/operations/{handle}", response_model=m.Operation)
    def operation(handle: str, principal: Viewer) -> dict[str, Any]:
        """one operation by the handle a list gave (never raw ids in a URL); logged"""
        return console().by_handle(ApiRequest(principal, {}), handle)

    @routes.get("/groups", response_model=m.Groups)
    def groups(principal: Viewer) -> dict[str, Any]:
        """parked and failed rows by job type, state, outcome code and error class"""
        return console().failure_groups(ApiRequest(principal, {}))

    @routes.get("/groups/{handle}", response_model=m.GroupRows)
    def group(handle: str, principal: Viewer, limit: GroupLimit = 50) -> dict[str, Any]:
        """a failure group's oldest rows (hashes only)"""
        return console().group_rows(ApiRequest(principal, {}), handle, limit)

    @routes.post("/groups/{handle}/redrive", response_model=m.GroupRedriveReport)
    def group_redrive(
        handle: str, body: m.GroupRedriveRequest, principal: Operator
    ) -> dict[str, Any]:
        """redrive a parked group's oldest rows (operator), dry run first; rate-capped"""
        fields = {**body.model_dump(), "group": handle}
        return console().group_redrive(ApiRequest(principal, {}), fields)

    @routes.post("/resolve", response_model=m.ResolveReport)
    def resolve(body: m.ResolveRequest, principal: Operator) -> dict[str, Any]:
        """close one rejected delivery a person has dealt with (operator), audited"""
        return console().resolve(ApiRequest(principal, {}), body.model_dump())

    return routes
