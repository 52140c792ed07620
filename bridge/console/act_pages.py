"""The acts of the pages kept from before the on-call work: an audited payload view and a
redrive (preview, then confirm) of one looked-up operation or of a queue's filters."""

from __future__ import annotations

from typing import Any

from bridge.console.page_types import ConsolePages, PageAnswer, PageError, PageRequest, form_field
from bridge.console.problems import Request
from bridge.console.sessions import Session

_REDRIVABLE = ("unknown", "quarantined")


def payload(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    """One operation's payload, for the payload role, with the reason it was asked for;
    the view is in the audit before this page exists."""
    handle = form_field(request.form, "selection")
    selection = session.selections.get(handle) if handle else None
    if selection is None or selection.purpose != "payload":
        raise PageError(400, "bad request", "this selection expired: look the operation up again")
    reason = (form_field(request.form, "reason") or "").strip()
    if not reason:
        raise PageError(400, "bad request", "a reason is required: it is recorded in the audit")
    view = pages.api.payload(Request(session.principal, {}, {**selection.fields, "reason": reason}))
    return pages.render(
        200, "payload.html", session, title="Payload", view=view, label=selection.label
    )


# -- the act -------------------------------------------------------------------------------


def redrive(pages: ConsolePages, request: PageRequest, session: Session) -> PageAnswer:
    """A dry run (``step=preview``) or the redrive itself (``step=confirm``) of either a
    remembered selection (one operation) or a queue's filters."""
    step = form_field(request.form, "step")
    if step not in ("preview", "confirm"):
        raise PageError(400, "bad request", "step must be preview or confirm")
    handle = form_field(request.form, "selection")
    queue_fields: dict[str, str] = {}
    if handle:
        selection = session.selections.get(handle)
        if selection is None or selection.purpose != "redrive":
            raise PageError(
                400, "bad request", "this selection expired: look the operation up again"
            )
        fields, label = dict(selection.fields), selection.label
    else:
        state = form_field(request.form, "state")
        if state not in _REDRIVABLE:
            raise PageError(400, "bad request", "state must be unknown or quarantined")
        fields = {"states": [state]}
        queue_fields["state"] = state
        for name in ("subscription", "job_type"):
            value = form_field(request.form, name)
            if value:
                fields[name] = queue_fields[name] = value
        label = "rows " + ", ".join(f"{k} {v}" for k, v in queue_fields.items())
    if form_field(request.form, "confirm_not_called") == "yes" and "operation_id" in fields:
        fields["confirm_not_called"] = True
    reason = form_field(request.form, "reason") or ""
    body = {**fields, "reason": reason, "dry_run": step == "preview"}
    report = pages.api.redrive(Request(session.principal, {}, body))
    audit: list[dict[str, Any]] | None = None
    if step == "confirm" and "operation_id" in fields:
        key = {"tenant_id": fields["tenant_id"], "operation_id": fields["operation_id"]}
        audit = pages.api.operation(Request(session.principal, {}, key))["redrives"]
    return pages.render(
        200,
        "redrive.html",
        session,
        title="Redrive preview" if report["dry_run"] else "Redrive done",
        report=report,
        label=label,
        reason=reason,
        selection=handle,
        queue_fields=queue_fields,
        confirm_not_called=fields.get("confirm_not_called", False),
        audit=audit,
    )
