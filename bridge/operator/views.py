"""What an operator is shown of a record, in one place: ``fencebridge inspect``, ``status`` and
the console's pages and API read these views, so a field added here appears in all of them.

Text a person typed (audit reasons, actors) or a program reported (error classes, findings)
may hold control characters; :func:`printable` makes any text safe to print on a terminal or
in a log line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bridge.store.evidence import DeliveryEvidence
from bridge.store.records import (
    AttemptRecord,
    OperationHistory,
    RedriveRecord,
    RejectedRecord,
    WorkRecord,
)
from bridge.types import State, Stats

#: characters kept as they are even though Unicode calls them control characters
_KEPT = frozenset("\t")


def printable(text: str) -> str:
    """``text`` with every control or format character (CR, LF, ESC, bidi overrides, ...)
    written as its escape, so that printing it cannot move the cursor, add a line, or colour
    the terminal."""
    if all(c in _KEPT or unicodedata.category(c) not in ("Cc", "Cf", "Cs") for c in text):
        return text
    return "".join(
        c
        if c in _KEPT or unicodedata.category(c) not in ("Cc", "Cf", "Cs")
        else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )


def reason_problem(text: str) -> str | None:
    """Why ``text`` cannot be an audit reason, or None when it can: a reason is read later on
    terminals and pages, so it holds no control or format characters."""
    if not text.strip():
        return "must not be blank"
    if printable(text) != text or "\t" in text:
        return "must not hold control characters (line breaks, escapes)"
    return None


# -- one operation -------------------------------------------------------------------------------

#: the redrive audit's mark of a payload view (kept beside the redrives, shown apart)
PAYLOAD_VIEWED = "payload_viewed"
#: how a payload's digest is shown: (tenant id, sha256 digest) -> text
Digest = Callable[[str, bytes], str]


def plain_digest(tenant_id: str, digest: bytes) -> str:
    """The digest as it is, for those who may read the database anyway (the CLI)."""
    return "sha256:" + digest.hex()


def iso(value: datetime | None) -> str | None:
    """A time for a JSON document: ISO 8601, or null when there is none."""
    return value.isoformat() if value is not None else None


def operation_view(
    history: OperationHistory,
    *,
    tenant: str | None,
    operation: str | None,
    digest: Digest,
    absence: str | None = None,
    evidence: DeliveryEvidence | None = None,
) -> dict[str, Any]:
    """One operation as every face shows it: its hashes (``tenant``, ``operation``), work row,
    attempts, redrives, payload views, rejected deliveries and, without a row, why not."""
    tenant_id = history.key.tenant_id
    return {
        "tenant": tenant,
        "operation": operation,
        "work_row": None if history.row is None else row_view(history.row, tenant_id, digest),
        "absence": absence if history.row is None else None,
        "attempts": [attempt_view(a) for a in history.attempts],
        "redrives": [redrive_view(r) for r in history.redrives if r.to_state != PAYLOAD_VIEWED],
        "payload_views": [
            {"at": iso(r.at), "actor": r.actor, "reason": r.reason}
            for r in history.redrives
            if r.to_state == PAYLOAD_VIEWED
        ],
        "rejected_deliveries": [rejected_view(r, tenant_id, digest) for r in history.rejected],
        "delivery_evidence": None if evidence is None else evidence_view(evidence),
    }


def evidence_view(e: DeliveryEvidence) -> dict[str, Any]:
    """How many copies of the operation's delivery arrived, when, and what each was."""
    return {
        "copies": e.copies,
        "first_seen": iso(e.first_seen),
        "last_seen": iso(e.last_seen),
        "replays": e.replays,
        "conflicts": e.conflicts,
    }


def row_view(row: WorkRecord, tenant_id: str, digest: Digest) -> dict[str, Any]:
    return {
        "subscription": row.subscription,
        "job_type": row.job_type,
        "target_class": row.target_class.value,
        "schema_version": row.schema_version,
        "state": row.state.value,
        "fence": row.fence,
        "attempts": row.attempts,
        "max_attempts": row.max_attempts,
        "lease_owner": row.lease_owner,
        "lease_expires_at": iso(row.lease_expires_at),
        # only a queued row has a next attempt; on any other it is a leftover
        "next_attempt_at": iso(row.next_attempt_at) if row.state is State.QUEUED else None,
        "intent_fence": row.intent_fence,
        "outcome_code": row.outcome_code,
        "outcome_detail": row.outcome_detail,
        "payload_hash": digest(tenant_id, row.payload_hash),
        "payload_bytes": row.payload_bytes,
        "broker_message_id": row.broker_message_id,
        "receive_count": row.receive_count,
        "created_at": iso(row.created_at),
        "claimed_at": iso(row.claimed_at),
        "settled_at": iso(row.settled_at),
        "updated_at": iso(row.updated_at),
        "trace_id": row.trace_id,
        "traceparent": row.trace_context,
    }


def attempt_view(a: AttemptRecord) -> dict[str, Any]:
    return {
        "kind": a.kind,
        "fence": a.fence,
        "worker": a.worker,
        "takeover": a.takeover,
        "started_at": iso(a.started_at),
        "ended_at": iso(a.ended_at),
        "outcome": a.outcome,
        "outcome_code": a.outcome_code,
        "error_class": a.error_class,
        "finding": a.finding,
    }


def redrive_view(r: RedriveRecord) -> dict[str, Any]:
    return {
        "at": iso(r.at),
        "actor": r.actor,
        "reason": r.reason,
        "from_state": r.from_state,
        "to_state": r.to_state,
        "fence": r.fence,
        "attempts": r.attempts,
    }


def rejected_view(r: RejectedRecord, tenant_id: str, digest: Digest) -> dict[str, Any]:
    return {
        "id": r.id,
        "kind": r.kind,
        "reason": r.reason,
        "subscription": r.subscription,
        "broker_message_id": r.broker_message_id,
        "payload_hash": digest(tenant_id, r.payload_hash) if r.payload_hash else None,
        "created_at": iso(r.created_at),
        "redriven_at": iso(r.redriven_at),
        "redriven_by": r.redriven_by,
        "redrive_reason": r.redrive_reason,
        "redrive_outcome": r.redrive_outcome,
        "resolved_at": iso(r.resolved_at),
        "resolved_by": r.resolved_by,
        "resolution_reason": r.resolution_reason,
        "open": r.open,
    }


# -- the whole -----------------------------------------------------------------------------------

_STATES = tuple(s.value for s in State)


def status_view(stats: Stats, tenant_hash: Callable[[str], str]) -> dict[str, Any]:
    """Counts by state per subscription and tenant hash, and the figures a person looks at
    first: stalled claims, the oldest unknown, rejected deliveries awaiting a person."""
    grouped: dict[tuple[str, str], dict[str, int]] = {}
    for c in stats.counts:
        key = (c.subscription, tenant_hash(c.tenant_id))
        grouped.setdefault(key, dict.fromkeys(_STATES, 0))[c.state.value] += c.count
    return {
        "counts": [
            {"subscription": sub, "tenant": tenant, "states": states}
            for (sub, tenant), states in sorted(grouped.items())
        ],
        "totals": {s: sum(g[s] for g in grouped.values()) for s in _STATES},
        "stalled_claims": stats.stalled_claims,
        "oldest_unknown_seconds": stats.oldest_unknown_seconds,
        "rejected": dict(stats.rejected),
    }
