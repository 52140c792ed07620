"""``fencebridge inspect``: one operation's row, its attempts, its redrives, its rejected
deliveries and its outbox messages (with their resends), and, when there is no row, why as far
as the database can tell."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, stored_text
from bridge.commands.session import (
    iso_time,
    log_hashes,
    moment,
    open_store,
    optional_hasher,
    print_json,
)
from bridge.identity import IDENTITY_KEY_ENV
from bridge.operator.views import operation_view, plain_digest, printable
from bridge.types import State

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.store.evidence import DeliveryEvidence
    from bridge.store.outbox import OutboxRecord, ResendAudit
    from bridge.store.records import AttemptRecord, ErasureRecord, OperationHistory


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "inspect",
        help="one operation's history: its row, attempts, redrives, rejected deliveries",
        description="Never prints payload bytes: their size and sha256 only.",
    )
    p.add_argument("tenant", type=stored_text, help="the tenant id")
    p.add_argument("operation", type=stored_text, help="the operation id")
    p.add_argument("--json", action="store_true", help="print a JSON document instead")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.types import Key

    key = Key(args.tenant, args.operation)
    with open_store(args) as store:
        hasher = optional_hasher(store)
        history = store.operator.history(key)
        outbox = store.outbox.of_operation(key.tenant_id, key.operation_id)
        resends = store.outbox.resends_of_operation(key.tenant_id, key.operation_id)
        evidence = store.operator.evidence(key)
        erasures = (
            store.operator.erasures(
                hasher.tenant(key.tenant_id), hasher.operation(key.tenant_id, key.operation_id)
            )
            if hasher is not None and history.row is None
            else []
        )
    absence = _absence(history, erasures, checked=hasher is not None)
    document = {
        "tenant_id": key.tenant_id,
        "operation_id": key.operation_id,
        **operation_view(
            history,
            tenant=hasher.tenant(key.tenant_id) if hasher is not None else None,
            operation=hasher.operation(key.tenant_id, key.operation_id) if hasher else None,
            digest=plain_digest,
            absence=absence,
            evidence=evidence,
        ),
    }
    document["outbox"] = [
        {
            "message_id": m.message_id,
            "destination": m.destination,
            "state": m.state,
            "fence": m.fence,
            "attempts": m.attempts,
            "last_error": m.last_error,
            "park_reason": m.park_reason,
            "created_at": iso_time(m.created_at),
            "sent_at": iso_time(m.sent_at),
            "parked_at": iso_time(m.parked_at),
        }
        for m in outbox
    ]
    document["outbox_resends"] = [
        {
            "at": iso_time(r.at),
            "actor": r.actor,
            "reason": r.reason,
            "message_id": r.message_id,
            "destination": r.destination,
            "from_state": r.from_state,
            "to_state": r.to_state,
            "attempts": r.attempts,
            "park_reason": r.park_reason,
        }
        for r in resends
    ]
    hashes: list[str] = []
    if hasher is not None:
        hashes = log_hashes(hasher, key)
        document["log_hashes"] = hashes
    if history.row is None:
        document["work_row_absent"] = {
            "explanation": absence,
            "tenant_erasures": [
                {
                    "at": iso_time(e.at),
                    "actor": e.actor,
                    "reason": e.reason,
                    "one_operation": e.one_operation,
                }
                for e in erasures
            ],
        }
    if args.json:
        print_json(document)
    else:
        lines = _history_lines(history, absence)
        if evidence is not None:
            lines.insert(1, f"  deliveries     {_evidence_line(evidence)}")
        lines[-1:-1] = _outbox_lines(outbox, resends)
        if hashes:
            lines.insert(1, f"  log hashes     {' '.join(hashes)}")
        print("\n".join(printable(line) for line in lines))
    return 0 if history.found else 1


def _evidence_line(e: DeliveryEvidence) -> str:
    return (
        f"{e.copies} cop{'y' if e.copies == 1 else 'ies'} arrived ({e.replays} replay(s), "
        f"{e.conflicts} conflict(s)), first {moment(e.first_seen)}, last {moment(e.last_seen)}"
    )


def _outbox_lines(outbox: Sequence[OutboxRecord], resends: Sequence[ResendAudit]) -> list[str]:
    lines = [f"outbox messages: {len(outbox) or 'none'}"]
    for m in outbox:
        when = {"sent": m.sent_at, "parked": m.parked_at}.get(m.state) or m.created_at
        lines.append(
            f"  {m.message_id}  {m.destination}  {m.state} {moment(when)}  fence {m.fence}, "
            f"{m.attempts} failed send(s)"
        )
        if m.park_reason:
            lines.append(f"      {m.park_reason}")
        elif m.last_error:
            lines.append(f"      last error: {m.last_error}")
    if resends:
        lines.append(f"outbox resends: {len(resends)}")
    lines += [
        f"  {moment(r.at)}  {r.message_id}  {r.from_state} -> {r.to_state}  after "
        f"{r.attempts} failed send(s)  by {r.actor}: {r.reason}"
        for r in resends
    ]
    return lines


def _absence(history: OperationHistory, erasures: Sequence[ErasureRecord], *, checked: bool) -> str:
    """Why there is no work row, as far as the database can still tell."""
    if history.row is not None:
        return ""
    if erasures:
        last = erasures[0]
        what = "it was erased" if last.one_operation else "its tenant was erased"
        return (
            f"erased: {what} at {moment(last.at)} by {last.actor} ({last.reason}); a tombstone "
            "(keyed hashes, payload hash, state) makes a redelivery of it a replay until "
            "[retention] tombstone_days have passed"
        )
    ingested = bool(history.redrives) or any(
        r.kind == "conflict" or r.redrive_outcome is not None for r in history.rejected
    )
    if ingested:
        return (
            "purged by retention: the records below show it was ingested, and no erasure of "
            "its tenant is recorded"
            if checked
            else "purged by retention (the records below show it was ingested), or erased with "
            f"its tenant: set ${IDENTITY_KEY_ENV} to check the erasure record"
        )
    if history.rejected:
        return "never ingested: only the quarantined deliveries below were recorded under its key"
    if not checked:
        return (
            "never ingested, purged by retention or erased with its tenant: set "
            f"${IDENTITY_KEY_ENV} to check the erasure record (it names tenants by keyed hash)"
        )
    return (
        "never ingested, or purged by retention: no erasure of its tenant is recorded, and a "
        "purge keeps no record of which operations it removed"
    )


def _history_lines(history: OperationHistory, absence: str) -> list[str]:
    key, row = history.key, history.row
    lines = [f"operation {key.operation_id!r} of tenant {key.tenant_id!r}"]
    if row is None:
        lines.append(f"work row: none ({absence})")
    else:
        lease = (
            "-"
            if row.lease_owner is None
            else f"{row.lease_owner} until {moment(row.lease_expires_at)}"
        )
        outcome = row.outcome_code or "-"
        if row.outcome_detail:
            outcome += f" ({row.outcome_detail})"
        payload = f"sha256 {row.payload_hash.hex()}, " + (
            "gone" if row.payload_bytes is None else f"{row.payload_bytes} bytes"
        )
        intent = "-" if row.intent_fence is None else str(row.intent_fence)
        trace = row.trace_id or "none recorded (the delivery carried no trace context)"
        upcoming = (
            [f"  next attempt   {moment(row.next_attempt_at)}"] if row.state is State.QUEUED else []
        )
        lines += [
            f"  subscription   {row.subscription}",
            f"  job type       {row.job_type} (class {row.target_class.value})",
            f"  state          {row.state.value}",
            f"  outcome        {outcome}",
            f"  fence          {row.fence} (intent recorded at fence: {intent})",
            f"  attempts       {row.attempts} of {row.max_attempts}",
            f"  lease          {lease}",
            *upcoming,
            f"  created        {moment(row.created_at)}",
            f"  last claimed   {moment(row.claimed_at)}",
            f"  settled        {moment(row.settled_at)}",
            f"  updated        {moment(row.updated_at)}",
            f"  payload        {payload}",
            f"  trace id       {trace}",
        ]
    lines.append(f"attempts: {len(history.attempts) or 'none recorded'}")
    lines += [_attempt_line(a) for a in history.attempts]
    lines.append(f"redrives: {len(history.redrives) or 'none'}")
    lines += [
        f"  {moment(r.at)}  {r.from_state} -> {r.to_state}  fence {r.fence}, attempts {r.attempts}"
        f"  by {r.actor}: {r.reason}"
        for r in history.redrives
    ]
    lines.append(f"rejected deliveries: {len(history.rejected) or 'none'}")
    for r in history.rejected:
        if r.resolved_at is not None:
            closed = f"resolved {moment(r.resolved_at)} by {r.resolved_by}: {r.resolution_reason}"
        elif r.redriven_at is not None:
            closed = f"redriven {moment(r.redriven_at)} by {r.redriven_by} -> {r.redrive_outcome}"
        else:
            closed = "open (awaiting a person)"
        lines.append(f"  #{r.id}  {moment(r.created_at)}  {r.kind}  {r.subscription}  {closed}")
        lines.append(f"      {r.reason}")
    lines.append(
        "not shown: payload bytes, error text, heartbeats, and attempts older than the newest "
        "kept per row ([bridge] attempt_history)"
    )
    return lines


def _attempt_line(a: AttemptRecord) -> str:
    """One attempt: when, under which fence and by whom, and how it ended."""
    ended = "open" if a.ended_at is None else f"ended {moment(a.ended_at)}"
    how = " ".join(
        part
        for part in (
            a.outcome or "",
            f"({a.outcome_code})" if a.outcome_code else "",
            f"error {a.error_class}" if a.error_class else "",
            f"lookup {a.finding}" if a.finding else "",
        )
        if part
    )
    who = f"by {a.worker}" if a.worker else "by an operator"
    takeover = ", takeover" if a.takeover else ""
    line = f"  {moment(a.started_at)}  {a.kind}  fence {a.fence}{takeover}  {who}  {ended}  {how}"
    return line.rstrip()
