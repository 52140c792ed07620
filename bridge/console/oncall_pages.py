"""The on-call pages: an operation opened from a list by its handle, failure groups with a
group redrive (preview, then confirm), and closing a rejected delivery; each form carries the
session's CSRF token, each act is audited by the API route it calls."""

from __future__ import annotations

from bridge.console.page_types import ConsolePages, PageAnswer, PageRequest
from bridge.console.problems import ApiError, Request
from bridge.console.sessions import Session

#: rows of a group a page lists
GROUP_PAGE = 50


def _handle(request: PageRequest) -> str:
    return request.path.rpartition("/")[2]


def _form(request: PageRequest, name: str) -> str:
    values = request.form.get(name) or [""]
    return values[0]


def operation(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    """One operation by the signed handle of a list's row: no raw id in the URL."""
    handle = _handle(request)
    ask = Request(session.principal, {})
    found = pages.api.by_handle(ask, handle)
    key = pages.api.key_of(handle)
    return pages.show_operation(session, found, key.tenant_id, key.operation_id)


def groups(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    listed = pages.api.failure_groups(Request(session.principal, {}))
    return pages.render(
        200, "groups.html", session, title="Failure groups", groups=listed["groups"], query=""
    )


def group(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    handle = _handle(request)
    rows = pages.api.group_rows(Request(session.principal, {}), handle, GROUP_PAGE)
    summary = next(
        (
            g
            for g in pages.api.failure_groups(Request(session.principal, {}))["groups"]
            if g["handle"] == handle
        ),
        None,
    )
    return pages.render(
        200,
        "group.html",
        session,
        title="Failure group",
        group=rows,
        summary=summary,
        handle=handle,
        report=None,
    )


def group_redrive(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    """A group's dry run (``step=preview``: how many rows it would move) or its redrive."""
    step = _form(request, "step")
    if step not in ("preview", "confirm"):
        raise ApiError(400, "bad request", "step must be preview or confirm")
    handle = _form(request, "group")
    reason = _form(request, "reason").strip()
    if not reason:
        raise ApiError(400, "bad request", "a reason is required: it is recorded in the audit")
    limit_text = _form(request, "limit") or "100"
    if not (limit_text.isascii() and limit_text.isdigit()) or not 1 <= int(limit_text) <= 100:
        raise ApiError(400, "bad request", "limit must be a whole number from 1 to 100")
    body = {
        "group": handle,
        "reason": reason,
        "dry_run": step == "preview",
        "limit": int(limit_text),
    }
    report = pages.api.group_redrive(Request(session.principal, {}), body)
    rows = pages.api.group_rows(Request(session.principal, {}), handle, GROUP_PAGE)
    return pages.render(
        200,
        "group.html",
        session,
        title="Group redrive preview" if report["dry_run"] else "Group redrive done",
        group=rows,
        summary=None,
        handle=handle,
        report=report,
        reason=reason,
        limit=int(limit_text),
    )


def resolve(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    """Close one rejected delivery (``step=preview`` first), as ``fencebridge resolve``."""
    step = _form(request, "step")
    if step not in ("preview", "confirm"):
        raise ApiError(400, "bad request", "step must be preview or confirm")
    delivery = _form(request, "delivery")
    reason = _form(request, "reason").strip()
    if not reason:
        raise ApiError(400, "bad request", "a reason is required: it is recorded on the delivery")
    body = {"delivery": delivery, "reason": reason, "dry_run": step == "preview"}
    report = pages.api.resolve(Request(session.principal, {}), body)
    key = pages.api.key_of(delivery)
    found = pages.api.by_handle(Request(session.principal, {}), delivery)
    return pages.render(
        200,
        "resolve.html",
        session,
        title="Close preview" if report["dry_run"] else "Closed",
        report=report,
        delivery=delivery,
        reason=reason,
        found=found,
        operation_hash=found["operation"] or key.operation_id[:0],
    )
