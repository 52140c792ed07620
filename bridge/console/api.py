"""The console's routes: each takes a parsed request and answers a JSON document or a
:class:`ApiError`. No HTTP here (that is :mod:`.server`), so the rules are in one place.

Identifiers leave only as keyed hashes. A single operation is asked for with its raw tenant and
operation id in a POST body, never in a URL, so that they stay out of access logs and browser
history; the answer carries the hashes only. Payload bytes are read by one route only
(``POST /payload``, the payload role, a reason required), and the statement that reads them
writes the audit entry of that view.

The go/no-go table is :func:`bridge.operator.check.evaluate`'s report, as ``fencebridge check``
prints it: the console shows what the check decides and decides nothing itself.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bridge import keyring
from bridge.config import BridgeConfig
from bridge.console.auth import Role
from bridge.console.oncall_api import GROUP_RATE, OnCall
from bridge.console.problems import ApiError, Request, bad_request
from bridge.console.sessions import Signer
from bridge.console.throttle import RateCap
from bridge.identity import IdentityHasher
from bridge.operator.check import Report
from bridge.operator.redrive import Redrive, RedriveReport
from bridge.operator.views import printable, reason_problem, status_view
from bridge.store import PostgresStore
from bridge.types import Key, RedriveFilter, State

log = logging.getLogger(__name__)
#: who looked which operation up by its raw ids (hashes only): the lookups' audit trail
audit = logging.getLogger("bridge.console.audit")

PREFIX = "/api/v1"
PAGE_DEFAULT = 50
PAGE_MAX = 500
REDRIVE_LIMIT_MAX = 1000
EXTRA_ATTEMPTS_MAX = 10
TEXT_MAX = 1000
_STATES = tuple(s.value for s in State)
#: the figures' windows: name -> (buckets, bucket length)
WINDOWS: dict[str, tuple[int, timedelta]] = {
    "15m": (15, timedelta(minutes=1)),
    "1h": (60, timedelta(minutes=1)),
    "6h": (72, timedelta(minutes=5)),
    "24h": (96, timedelta(minutes=15)),
}
WINDOW_DEFAULT = "1h"
#: an audit entry of a payload view, told apart from the redrives it is kept beside
PAYLOAD_VIEWED = "payload_viewed"


Handler = Callable[["ConsoleApi", Request], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    role: Role
    #: None: the route takes more than the request (:mod:`.oncall_routes`)
    handler: Handler | None


class ConsoleApi(OnCall):
    """The routes over one store, configuration (for the handlers a redrive's lookups need),
    identity hasher (already compared with the database's keys) and the go/no-go check
    (``checks`` runs it afresh: the catalog and the handlers can change under a console)."""

    def __init__(
        self,
        store: PostgresStore,
        config: BridgeConfig,
        hasher: IdentityHasher,
        *,
        checks: Callable[[], Report],
        signer: Signer | None = None,
    ) -> None:
        self._signer = signer or Signer()
        self._rate = RateCap(GROUP_RATE)
        self._store = store
        self._config = config
        self._hasher = hasher
        self._checks = checks

    # -- reads ---------------------------------------------------------------------------------

    def counts(self, request: Request) -> dict[str, Any]:
        _no_query(request, ())
        grouped: dict[tuple[str, str, str], dict[str, int]] = {}
        totals = dict.fromkeys(_STATES, 0)
        for c in self._store.console.group_counts():
            key = (c.subscription, c.job_type, self._hasher.tenant(c.tenant_id))
            grouped.setdefault(key, dict.fromkeys(_STATES, 0))[c.state.value] += c.count
            totals[c.state.value] += c.count
        return {
            "counts": [
                {"subscription": sub, "job_type": job, "tenant": tenant, "states": states}
                for (sub, job, tenant), states in sorted(grouped.items())
            ],
            "totals": totals,
        }

    def status(self, request: Request) -> dict[str, Any]:
        """``fencebridge status``'s document (its own view), without the CLI's extras."""
        _no_query(request, ())
        return status_view(self._store.operator.stats(), self._hasher.tenant)

    def rows(self, request: Request) -> dict[str, Any]:
        _no_query(request, ("state", "subscription", "job_type", "limit", "cursor"))
        raw_state = _one(request, "state")
        if raw_state is None:
            raise bad_request(f"state is required: one of {', '.join(_STATES)}")
        try:
            state = State(raw_state)
        except ValueError:
            raise bad_request(f"unknown state: expected one of {', '.join(_STATES)}") from None
        limit = _limit(request)
        after = self._cursor(request, "rows")
        page = self._store.console.rows_page(
            state,
            after=after,
            limit=limit + 1,
            subscription=_one(request, "subscription"),
            job_type=_one(request, "job_type"),
        )
        more, page = len(page) > limit, page[:limit]
        return {
            "rows": [
                {
                    "tenant": self._hasher.tenant(r.key.tenant_id),
                    "operation": self._hasher.operation(r.key.tenant_id, r.key.operation_id),
                    "handle": self.row_handle(r.seq),
                    "subscription": r.subscription,
                    "job_type": r.job_type,
                    "target_class": r.target_class.value,
                    "state": r.state.value,
                    "fence": r.fence,
                    "attempts": r.attempts,
                    "max_attempts": r.max_attempts,
                    "outcome_code": r.outcome_code,
                    "created_at": _time(r.created_at),
                    "claimed_at": _time(r.claimed_at),
                    "settled_at": _time(r.settled_at),
                    "lease_expires_at": _time(r.lease_expires_at),
                }
                for r in page
            ],
            "next_cursor": self._signer.sign("rows", page[-1].seq) if more else None,
        }

    def rejected(self, request: Request) -> dict[str, Any]:
        _no_query(request, ("kind", "open", "limit", "cursor"))
        kind = _one(request, "kind")
        if kind not in (None, "conflict", "quarantined"):
            raise bad_request("unknown kind: expected conflict or quarantined")
        open_text = _one(request, "open") or "false"
        if open_text not in ("true", "false"):
            raise bad_request("open must be true or false")
        limit = _limit(request)
        page = self._store.console.rejected_page(
            after=self._cursor(request, "rejected"),
            limit=limit + 1,
            kind=kind,
            open_only=open_text == "true",
        )
        more, page = len(page) > limit, page[:limit]
        return {
            "rejected": [
                {
                    "id": r.id,
                    "kind": r.kind,
                    "reason": r.reason,
                    "subscription": r.subscription,
                    **self._hashes(r.key),
                    "handle": self.rejected_handle(r.id) if r.key is not None else None,
                    "created_at": _time(r.created_at),
                    "redriven_at": _time(r.redriven_at),
                    "redriven_by": r.redriven_by,
                    "redrive_outcome": r.redrive_outcome,
                    "resolved_at": _time(r.resolved_at),
                    "resolved_by": r.resolved_by,
                }
                for r in page
            ],
            "next_cursor": self._signer.sign("rejected", page[-1].id) if more else None,
        }

    def operation(self, request: Request) -> dict[str, Any]:
        _no_query(request, ())
        body = _object(request.body, {"tenant_id", "operation_id"})
        tenant, operation = _required(body, "tenant_id"), _required(body, "operation_id")
        key = Key(tenant, operation)
        history = self._store.operator.history(key)
        audit.info(
            "console lookup by %s of operation %s: %s",
            request.principal.name,
            self._hasher.operation(tenant, operation),
            "found" if history.found or history.rejected else "nothing",
        )
        if history.row is None and not history.rejected and not history.redrives:
            # no hash of ids the database does not hold: a guess cannot be confirmed here
            raise ApiError(404, "not found", "no such operation")
        return self.operation_document(history)

    def checks(self, request: Request) -> dict[str, Any]:
        _no_query(request, ())
        report = self._checks()
        jobs = sorted({f.job_type for f in report.findings})
        failing: dict[str, list[int]] = {}
        for f in report.no_go:
            failing.setdefault(f.job_type, []).append(f.control.number)
        if report.go:
            summary = f"GO: all 9 controls hold for {len(jobs)} job type(s)"
        else:
            which = "; ".join(f"{j}: {', '.join(map(str, n))}" for j, n in failing.items())
            summary = (
                f"NO-GO: {len(report.no_go)} control(s) fail ({which})"
                if which
                else ("NO-GO: no job type to check")
            )
        return {
            "go": report.go,
            "summary": summary,
            "job_types": jobs,
            "findings": [
                {
                    "job_type": f.job_type,
                    "control": f.control.number,
                    "title": f.control.title,
                    "go": f.verdict.go,
                    "evidence": f.verdict.evidence,
                }
                for f in report.findings
            ],
        }

    def figures(self, request: Request) -> dict[str, Any]:
        _no_query(request, ("window",))
        window = _one(request, "window") or WINDOW_DEFAULT
        if window not in WINDOWS:
            raise bad_request(f"window must be one of {', '.join(WINDOWS)}")
        buckets, bucket = WINDOWS[window]
        points = self._store.console.figures(buckets=buckets, bucket=bucket)
        series = [
            {
                "at": _time(p.at),
                "stalled": p.stalled,
                "oldest_unknown_seconds": p.oldest_unknown_seconds,
                "quarantined": p.quarantined,
                "takeovers": p.takeovers,
            }
            for p in points
        ]
        return {
            "window": window,
            "bucket_seconds": int(bucket.total_seconds()),
            "current": series[-1] if series else None,
            "series": series,
        }

    # -- the acts ------------------------------------------------------------------------------

    def payload(self, request: Request) -> dict[str, Any]:
        """One operation's payload bytes for the payload role; the view is audited (actor,
        reason, time) by the statement that reads them."""
        _no_query(request, ())
        body = _object(request.body, {"tenant_id", "operation_id", "reason"})
        key = Key(_required(body, "tenant_id"), _required(body, "operation_id"))
        reason = _printable(_required(body, "reason"))
        view = self._store.console.view_payload(key, actor=request.principal.name, reason=reason)
        if view is None:
            raise ApiError(404, "not found", "no work row for this operation: nothing to show")
        log.info(
            "console payload view by %s of operation %s",
            request.principal.name,
            self._hasher.operation(key.tenant_id, key.operation_id),
        )
        data = view.body
        text: str | None = None
        if data is not None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        return {
            **self._hashes(key),
            "bytes": len(data) if data is not None else None,
            "payload_base64": base64.b64encode(data).decode() if data is not None else None,
            "payload_text": text,
            "viewed_at": _time(view.viewed_at),
            "viewed_by": request.principal.name,
            "reason": reason,
        }

    def redrive(self, request: Request) -> dict[str, Any]:
        _no_query(request, ())
        fields = {
            "reason",
            "dry_run",
            "states",
            "subscription",
            "job_type",
            "tenant_id",
            "operation_id",
            "limit",
            "extra_attempts",
            "confirm_not_called",
        }
        body = _object(request.body, fields)
        reason = _printable(_required(body, "reason"))
        dry_run = body.get("dry_run")
        if not isinstance(dry_run, bool):
            raise bad_request("dry_run is required: true to preview, false to redrive")
        states = _states(body.get("states", ["unknown", "quarantined"]))
        tenant, operation = _text(body, "tenant_id"), _text(body, "operation_id")
        if operation is not None and tenant is None:
            raise bad_request("operation_id needs tenant_id")
        confirm = body.get("confirm_not_called", False)
        if not isinstance(confirm, bool):
            raise bad_request("confirm_not_called must be true or false")
        if confirm and operation is None:
            raise bad_request("confirm_not_called applies to one operation: give its ids")
        selection = RedriveFilter(
            states=states,
            subscription=_text(body, "subscription"),
            tenant_id=tenant,
            job_type=_text(body, "job_type"),
            keys=(Key(tenant, operation),) if tenant is not None and operation else None,
            limit=_bounded(body, "limit", 100, REDRIVE_LIMIT_MAX),
        )
        if not dry_run:
            keyring.attach(
                self._store.keys, self._hasher, used_by="fencebridge console", first_use=False
            )
        report = Redrive(
            self._store,
            self._config,
            self._hasher,
            actor=request.principal.name,
            reason=reason,
            dry_run=dry_run,
            extra_attempts=_bounded(body, "extra_attempts", 1, EXTRA_ATTEMPTS_MAX),
            confirm_not_called=confirm,
        ).run(selection, deliveries=State.QUARANTINED in states)
        log.info(
            "console redrive by %s: %d moved, %d left%s",
            request.principal.name,
            report.moved,
            report.left,
            " (dry run)" if dry_run else "",
        )
        return self._report(report)

    def _report(self, report: RedriveReport) -> dict[str, Any]:
        return {
            "dry_run": report.dry_run,
            "moved": report.moved,
            "left": report.left,
            "rows": [
                {
                    **self._hashes(r.row.key),
                    "state": r.row.state.value,
                    "target_class": r.row.target_class.value,
                    "subscription": r.row.subscription,
                    "job_type": r.row.job_type,
                    "to": r.to.value if r.to is not None else None,
                    "note": r.note,
                }
                for r in report.rows
            ],
            "deliveries": [
                {
                    "id": d.delivery.id,
                    "subscription": d.delivery.subscription,
                    **self._hashes(d.key),
                    "decision": d.decision.value if d.decision is not None else None,
                    "note": d.note,
                }
                for d in report.deliveries
            ],
        }

    def _cursor(self, request: Request, kind: str) -> int:
        """The position after which a page starts; a cursor is signed, and only one this list
        handed out is accepted."""
        text = _one(request, "cursor")
        if text is None:
            return 0
        position = self._signer.unsign(kind, text)
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise bad_request(
                "bad cursor: pass back the next_cursor of the previous page unchanged"
            )
        return position

    def _hashes(self, key: Key | None) -> dict[str, str | None]:
        if key is None:
            return {"tenant": None, "operation": None}
        return {
            "tenant": self._hasher.tenant(key.tenant_id),
            "operation": self._hasher.operation(key.tenant_id, key.operation_id),
        }


#: every route the console answers (served and described by :mod:`.web`)
ROUTES: tuple[Route, ...] = (
    Route("GET", f"{PREFIX}/counts", Role.VIEWER, ConsoleApi.counts),
    Route("GET", f"{PREFIX}/status", Role.VIEWER, ConsoleApi.status),
    Route("GET", f"{PREFIX}/rows", Role.VIEWER, ConsoleApi.rows),
    Route("GET", f"{PREFIX}/rejected", Role.VIEWER, ConsoleApi.rejected),
    Route("POST", f"{PREFIX}/operation", Role.VIEWER, ConsoleApi.operation),
    Route("POST", f"{PREFIX}/redrive", Role.OPERATOR, ConsoleApi.redrive),
    Route("GET", f"{PREFIX}/checks", Role.VIEWER, ConsoleApi.checks),
    Route("GET", f"{PREFIX}/figures", Role.VIEWER, ConsoleApi.figures),
    Route("POST", f"{PREFIX}/payload", Role.PAYLOAD, ConsoleApi.payload),
    Route("GET", f"{PREFIX}/awaiting", Role.VIEWER, ConsoleApi.awaiting),
    Route("GET", f"{PREFIX}/operations/{{handle}}", Role.VIEWER, None),
    Route("GET", f"{PREFIX}/groups", Role.VIEWER, ConsoleApi.failure_groups),
    Route("GET", f"{PREFIX}/groups/{{handle}}", Role.VIEWER, None),
    Route("POST", f"{PREFIX}/groups/{{handle}}/redrive", Role.OPERATOR, None),
    Route("POST", f"{PREFIX}/resolve", Role.OPERATOR, None),
)


# -- input ---------------------------------------------------------------------------------------


def _no_query(request: Request, allowed: Sequence[str]) -> None:
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise bad_request(f"unknown query parameter: {unknown[0]}")


def _one(request: Request, name: str) -> str | None:
    values = request.query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise bad_request(f"{name} given more than once")
    if printable(values[0]) != values[0]:
        raise bad_request(f"{name} must not hold control characters")
    return values[0]


def _limit(request: Request) -> int:
    text = _one(request, "limit")
    if text is None:
        return PAGE_DEFAULT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= PAGE_MAX:
        raise bad_request(f"limit must be a whole number from 1 to {PAGE_MAX}")
    return int(text)


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unknown field: {unknown[0]}")
    return body


def _text(body: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise bad_request(f"{name} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"{name} must be a non-empty string")
    if len(value) > TEXT_MAX or "\x00" in value:
        raise bad_request(f"{name} must be at most {TEXT_MAX} characters, without NUL")
    return value


def _printable(reason: str) -> str:
    """A reason goes into the audit and onto terminals: no control or format characters."""
    problem = reason_problem(reason)
    if problem is not None:
        raise bad_request(f"reason {problem}")
    return reason


def _required(body: Mapping[str, Any], name: str) -> str:
    value = _text(body, name, required=True)
    assert value is not None  # _text raised otherwise
    return value


def _bounded(body: Mapping[str, Any], name: str, default: int, most: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise bad_request(f"{name} must be a whole number from 1 to {most}")
    return value


def _states(value: Any) -> tuple[State, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("states must be a non-empty list of unknown and quarantined")
    if any(v not in ("unknown", "quarantined") for v in value):
        raise bad_request("states: only unknown and quarantined rows can be redriven")
    return tuple(dict.fromkeys(State(v) for v in value))


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
