"""What on-call needs of the console's API, beside the lists of :mod:`.api`: what awaits a
person, operations opened by an opaque handle, failure groups and their redrive, and closing a
rejected delivery.

A handle is signed by the console (itsdangerous) and names a listed row by its sequence number
or a rejected delivery by its id, never by a tenant or operation identifier, so a URL holding
one tells nothing; opening one is logged like a lookup by ids. A failure group's redrive
selects the group's oldest rows (at most :data:`GROUP_LIMIT` a request) at the fence each was
seen at, and the console as a whole redrives at most :data:`GROUP_RATE` rows a minute this
way: a page cannot flood a provider that is barely back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bridge import keyring
from bridge.console.problems import ApiError, Request
from bridge.operator.redrive import Redrive
from bridge.operator.resolve import RejectionFilter, resolve
from bridge.operator.views import operation_view
from bridge.store.console import FailureGroup
from bridge.types import Key, RedriveFilter, State

if TYPE_CHECKING:
    from bridge.config import BridgeConfig
    from bridge.console.sessions import Signer
    from bridge.console.throttle import RateCap
    from bridge.identity import IdentityHasher
    from bridge.store import PostgresStore
    from bridge.store.records import OperationHistory

audit = logging.getLogger("bridge.console.audit")

#: rows one group redrive moves at most
GROUP_LIMIT = 100
#: rows the console's group redrives move at most per minute, together
GROUP_RATE = 300
#: failure groups listed at most
GROUPS_MAX = 200


class OnCall:
    """The on-call routes; mixed into :class:`~bridge.console.api.ConsoleApi`."""

    _store: PostgresStore
    _config: BridgeConfig
    _hasher: IdentityHasher
    _signer: Signer
    _rate: RateCap

    # -- handles -------------------------------------------------------------------------------

    def row_handle(self, seq: int) -> str:
        return self._signer.sign("operation", ["w", seq])

    def rejected_handle(self, rejected_id: int) -> str:
        return self._signer.sign("operation", ["r", rejected_id])

    def key_of(self, handle: str) -> Key:
        """The operation a handle names; 404 for a handle the console did not sign or whose
        record is gone."""
        value = self._signer.unsign("operation", handle)
        key: Key | None = None
        if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
            reads = self._store.console
            if value[0] == "w":
                key = reads.key_of_row(value[1])
            elif value[0] == "r":
                key = reads.key_of_rejected(value[1])
        if key is None:
            raise ApiError(404, "not found", "no such operation (or not this console's link)")
        return key

    def by_handle(self, request: Request, handle: str) -> dict[str, Any]:
        """One operation, opened from a list by its handle; logged like a lookup by ids."""
        key = self.key_of(handle)
        history = self._store.operator.history(key)
        audit.info(
            "console lookup by %s of operation %s: by handle",
            request.principal.name,
            self._hasher.operation(key.tenant_id, key.operation_id),
        )
        return self.operation_document(history)

    def operation_document(self, history: OperationHistory) -> dict[str, Any]:
        key = history.key
        return operation_view(
            history,
            tenant=self._hasher.tenant(key.tenant_id),
            operation=self._hasher.operation(key.tenant_id, key.operation_id),
            digest=self._hasher.payload,
            absence="no work row: only the rejected deliveries below are recorded under its key",
            evidence=self._store.operator.evidence(key),
        )

    # -- what awaits a person ------------------------------------------------------------------

    def awaiting(self, request: Request) -> dict[str, Any]:
        now = datetime.now(UTC)
        return {
            "awaiting": [
                {
                    "what": a.what,
                    "kind": a.kind,
                    "count": a.count,
                    "oldest_at": a.oldest.isoformat() if a.oldest else None,
                    "oldest_seconds": (now - a.oldest).total_seconds() if a.oldest else None,
                }
                for a in self._store.console.awaiting()
            ]
        }

    # -- failure groups ------------------------------------------------------------------------

    def group_handle(self, g: FailureGroup) -> str:
        return self._signer.sign(
            "group", [g.job_type, g.state.value, g.outcome_code, g.error_class]
        )

    def failure_groups(self, request: Request) -> dict[str, Any]:
        return {
            "groups": [
                {
                    "handle": self.group_handle(g),
                    "job_type": g.job_type,
                    "state": g.state.value,
                    "outcome_code": g.outcome_code,
                    "error_class": g.error_class,
                    "count": g.count,
                    "first_seen": g.first_seen.isoformat() if g.first_seen else None,
                    "last_seen": g.last_seen.isoformat() if g.last_seen else None,
                    "redrivable": g.state.parked,
                }
                for g in self._store.console.failure_groups(GROUPS_MAX)
            ]
        }

    def group_of(self, handle: str) -> dict[str, Any]:
        value = self._signer.unsign("group", handle)
        if not isinstance(value, list) or len(value) != 4:
            raise ApiError(404, "not found", "no such failure group (the link is not this one's)")
        job, state, code, error = value
        return {"job_type": job, "state": state, "outcome_code": code, "error_class": error}

    def group_rows(self, request: Request, handle: str, limit: int) -> dict[str, Any]:
        """The oldest rows of a group, each with its handle (hashes only)."""
        group = self.group_of(handle)
        rows = self._store.console.group_rows(
            job_type=group["job_type"],
            state=State(group["state"]),
            outcome_code=group["outcome_code"],
            error_class=group["error_class"],
            limit=limit,
        )
        return {
            **group,
            "rows": [
                {
                    "tenant": self._hasher.tenant(r.key.tenant_id),
                    "operation": self._hasher.operation(r.key.tenant_id, r.key.operation_id),
                    "fence": r.fence,
                }
                for r in rows
            ],
        }

    def group_redrive(self, request: Request, body: Mapping[str, Any]) -> dict[str, Any]:
        """A dry run (the count it would move) or the redrive of a group's oldest rows."""
        group = self.group_of(body["group"])
        state = State(group["state"])
        if not state.parked:
            raise ApiError(400, "bad request", f"{state.value} rows cannot be redriven")
        limit = int(body.get("limit", GROUP_LIMIT))
        rows = self._store.console.group_rows(
            job_type=group["job_type"],
            state=state,
            outcome_code=group["outcome_code"],
            error_class=group["error_class"],
            limit=limit,
        )
        dry_run = bool(body["dry_run"])
        if not dry_run:
            if not self._rate.take(len(rows)):
                raise ApiError(
                    429,
                    "too many",
                    f"group redrives move at most {self._rate.per_minute} rows a minute: "
                    "wait, or redrive fewer",
                )
            keyring.attach(
                self._store.keys, self._hasher, used_by="fencebridge console", first_use=False
            )
        selection = RedriveFilter(
            states=(state,),
            keys=tuple(r.key for r in rows) or None,
            fences=tuple(r.fence for r in rows) or None,
            limit=max(len(rows), 1),
        )
        report = (
            Redrive(
                self._store,
                self._config,
                self._hasher,
                actor=request.principal.name,
                reason=str(body["reason"]),
                dry_run=dry_run,
            ).run(selection, deliveries=False)
            if rows
            else None
        )
        audit.info(
            "console group redrive by %s: %s %s, %d selected%s",
            request.principal.name,
            group["job_type"],
            state.value,
            len(rows),
            " (dry run)" if dry_run else "",
        )
        return {
            **group,
            "selected": len(rows),
            "dry_run": dry_run,
            "moved": report.moved if report else 0,
            "left": report.left if report else 0,
            "rate_per_minute": self._rate.per_minute,
        }

    # -- closing a rejected delivery -------------------------------------------------------------

    def resolve(self, request: Request, body: Mapping[str, Any]) -> dict[str, Any]:
        """Close one rejected delivery a person has dealt with, as ``fencebridge resolve``."""
        value = self._signer.unsign("operation", body["delivery"])
        if not (isinstance(value, list) and len(value) == 2 and value[0] == "r"):
            raise ApiError(404, "not found", "no such rejected delivery")
        dry_run = bool(body["dry_run"])
        report = resolve(
            self._store.operator,
            RejectionFilter(ids=(int(value[1]),), limit=1),
            actor=request.principal.name,
            reason=str(body["reason"]),
            dry_run=dry_run,
        )
        audit.info(
            "console resolve by %s: %d closed%s",
            request.principal.name,
            len(report.resolved),
            " (dry run)" if dry_run else "",
        )
        return {
            "dry_run": dry_run,
            "resolved": len(report.resolved),
            "not_open": [why for _, why in report.not_open],
        }
