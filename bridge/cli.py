"""The ``fencebridge`` command line.

Settings come from flags or from ``FENCEBRIDGE_*`` environment variables; secrets (the
database URL) only from the environment or a flag, never from the subscription file.
Exit codes: 0 success, 1 a fencebridge error the message explains (for ``check``: a no-go;
for ``purge``: another purge was running), 2 bad usage, 130 interrupted, 141 the reader of
the output went away (``fencebridge status --json | head -1``), as a process killed by
SIGPIPE would report it.

The operator commands (status, inspect, redrive, resolve, sweep, purge, erase, check) never
print payload bytes. Tenants and operations are shown as keyed hashes
(``FENCEBRIDGE_IDENTITY_KEY``), the same ones logs and spans carry; only ``inspect``, given the
raw identifiers by the operator, echoes them back.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.database import DATABASE_URL_ENV, connect, database_url
from bridge.errors import FenceBridgeError
from bridge.identity import IDENTITY_KEY_ENV
from bridge.migrate import current_version, migrate
from bridge.telemetry.logs import configure_logging
from bridge.types import State

if TYPE_CHECKING:
    from bridge.check import Report
    from bridge.identity import IdentityHasher
    from bridge.operations import RedriveReport
    from bridge.records import ErasureRecord, OperationHistory
    from bridge.store import PostgresStore
    from bridge.types import Key, Stats

Command = Callable[[argparse.Namespace], int]

EXIT_CLOSED_PIPE = 128 + 13  # SIGPIPE


def _migrate(args: argparse.Namespace) -> int:
    with connect(database_url(args.database_url)) as conn:
        applied = migrate(conn)
        version = current_version(conn)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("nothing to apply")
    print(f"schema version {version}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from bridge.config import load_config  # noqa: PLC0415  (keeps `--help` fast)
    from bridge.identity import IdentityHasher  # noqa: PLC0415
    from bridge.runtime import open_bridge  # noqa: PLC0415
    from bridge.telemetry.setup import configure_telemetry  # noqa: PLC0415

    config = load_config(args.config)
    telemetry = configure_telemetry()  # an exporter it cannot honour stops the start here
    try:
        bridge = open_bridge(
            config,
            database_url(args.database_url),
            IdentityHasher.from_env(),
            limits=config.bridge.limits(),
        )
        if telemetry.metrics:
            bridge.telemetry.observe(bridge.store)
        try:
            bridge.run_until_signalled()
        finally:
            bridge.telemetry.stop_observing()
            bridge.store.close()
    finally:
        telemetry.shutdown()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from bridge.demo import scenario  # noqa: PLC0415

    if args.dir is not None and not args.keep:
        raise _usage("--dir names where --keep writes its files: add --keep, or drop --dir")
    return scenario.run(broker=args.broker, keep=args.keep, directory=args.dir)


# -- operator commands ---------------------------------------------------------------------------

_STATES = tuple(s.value for s in State)
_DURATION = re.compile(r"([1-9][0-9]*)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def _duration(text: str) -> timedelta:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30d, 12h or 90m, got {text!r}"
        )
    try:
        return timedelta(**{_UNITS[match[2]]: int(match[1])})
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _text(text: str) -> str:
    """A non-empty argument the database can store; never echoed (it may be an identifier)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not valid UTF-8 text") from None
    return text


def _span(age: timedelta) -> str:
    """A purge age as the operator wrote it: 30d, 12h or 90m."""
    minutes = int(age.total_seconds()) // 60
    if minutes % (24 * 60) == 0:
        return f"{minutes // (24 * 60)}d"
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def _store(args: argparse.Namespace) -> closing[PostgresStore]:
    """A small store for one command, closed when the ``with`` block ends."""
    from bridge.store import PostgresStore  # noqa: PLC0415

    return closing(PostgresStore.connect(database_url(args.database_url), max_size=2))


def _hasher() -> IdentityHasher:
    from bridge.identity import IdentityHasher  # noqa: PLC0415

    return IdentityHasher.from_env()


def _keyed(store: PostgresStore, hasher: IdentityHasher, *, record: str | None = None) -> None:
    """Compare the environment's identity keys with the database's before any hash is shown or
    key derived; ``record`` (the command) also records the key on first use, for commands that
    write hashes or derive idempotency keys."""
    from bridge import keyring  # noqa: PLC0415

    if record is None:
        keyring.verify(store, hasher)
    else:
        keyring.attach(store, hasher, used_by=f"fencebridge {record}")


def _optional_hasher(store: PostgresStore) -> IdentityHasher | None:
    """The compared keys when the environment sets one; None for commands that can do without."""
    if not os.environ.get(IDENTITY_KEY_ENV):
        return None
    hasher = _hasher()
    _keyed(store, hasher)
    return hasher


def _log_hashes(hasher: IdentityHasher, key: Key) -> list[str]:
    """The tenant's and the operation's keyed hashes, as logs and spans carry them."""
    return [hasher.tenant(key.tenant_id), hasher.operation(key.tenant_id, key.operation_id)]


def _at(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _iso(value: datetime | None) -> str | None:
    """A time for a JSON document: ISO 8601, or null when there is none."""
    return value.isoformat() if value is not None else None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {int(seconds) % 60}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def _status(args: argparse.Namespace) -> int:
    hasher = _hasher()  # refuse before touching the database: status shows hashes only
    with _store(args) as store:
        _keyed(store, hasher)
        stats = store.stats()
    document = _status_document(stats, hasher)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    rows = [
        [c["subscription"], c["tenant"], *(c["states"][s] for s in _STATES)]
        for c in document["counts"]
    ]
    rows.append(["total", "", *(document["totals"][s] for s in _STATES)])
    print("\n".join(_table(["subscription", "tenant", *_STATES], rows)))
    print()
    print(f"stalled claims (lease expired, still claimed): {stats.stalled_claims}")
    print(f"oldest unknown: {_age(stats.oldest_unknown_seconds)}")
    rejected = stats.rejected
    print(
        f"rejected deliveries awaiting a person: {rejected.get('conflict', 0)} conflict, "
        f"{rejected.get('quarantined', 0)} quarantined"
    )
    if any(rejected.values()):
        print(
            "  see them with `fencebridge inspect TENANT OPERATION`; close them with "
            "`fencebridge resolve` (conflicts) or `fencebridge redrive` (quarantined)"
        )
    return 0


def _status_document(stats: Stats, hasher: IdentityHasher) -> dict[str, Any]:
    grouped: dict[tuple[str, str], dict[str, int]] = {}
    for c in stats.counts:
        key = (c.subscription, hasher.tenant(c.tenant_id))
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


def _inspect(args: argparse.Namespace) -> int:
    from bridge.types import Key  # noqa: PLC0415

    key = Key(args.tenant, args.operation)
    with _store(args) as store:
        hasher = _optional_hasher(store)
        history = store.history(key)
        erasures = (
            store.erasures(hasher.tenant(key.tenant_id))
            if hasher is not None and history.row is None
            else []
        )
    document = _history_document(history)
    hashes: list[str] = []
    if hasher is not None:
        hashes = _log_hashes(hasher, key)
        document["log_hashes"] = hashes
    absence = _absence(history, erasures, checked=hasher is not None)
    if history.row is None:
        document["work_row_absent"] = {
            "explanation": absence,
            "tenant_erasures": [
                {"at": _iso(e.at), "actor": e.actor, "reason": e.reason} for e in erasures
            ],
        }
    if args.json:
        print(json.dumps(document, indent=2, default=str))
    else:
        lines = _history_lines(history, absence)
        if hashes:
            lines.insert(1, f"  log hashes     {' '.join(hashes)}")
        print("\n".join(lines))
    return 0 if history.found else 1


def _absence(history: OperationHistory, erasures: Sequence[ErasureRecord], *, checked: bool) -> str:
    """Why there is no work row, as far as the database can still tell."""
    if history.row is not None:
        return ""
    if erasures:
        last = erasures[0]
        return (
            f"erased: its tenant was erased at {_at(last.at)} by {last.actor} ({last.reason}); "
            "an erasure keeps no record of which operations it removed"
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


def _history_document(history: OperationHistory) -> dict[str, Any]:
    row = history.row
    work: dict[str, Any] | None = None
    if row is not None:
        work = {
            "subscription": row.subscription,
            "job_type": row.job_type,
            "target_class": row.target_class.value,
            "schema_version": row.schema_version,
            "state": row.state.value,
            "fence": row.fence,
            "attempts": row.attempts,
            "max_attempts": row.max_attempts,
            "lease_owner": row.lease_owner,
            "lease_expires_at": _iso(row.lease_expires_at),
            # only a queued row has a next attempt; on any other it is a leftover
            "next_attempt_at": _iso(row.next_attempt_at) if row.state is State.QUEUED else None,
            "intent_fence": row.intent_fence,
            "outcome_code": row.outcome_code,
            "outcome_detail": row.outcome_detail,
            "payload_sha256": row.payload_hash.hex(),
            "payload_bytes": row.payload_bytes,
            "broker_message_id": row.broker_message_id,
            "receive_count": row.receive_count,
            "created_at": _iso(row.created_at),
            "claimed_at": _iso(row.claimed_at),
            "settled_at": _iso(row.settled_at),
            "updated_at": _iso(row.updated_at),
            "trace_id": row.trace_id,
            "traceparent": row.trace_context,
        }
    return {
        "tenant_id": history.key.tenant_id,
        "operation_id": history.key.operation_id,
        "work_row": work,
        "redrives": [
            {
                "at": _iso(r.at),
                "actor": r.actor,
                "reason": r.reason,
                "from_state": r.from_state,
                "to_state": r.to_state,
                "fence": r.fence,
                "attempts": r.attempts,
            }
            for r in history.redrives
        ],
        "rejected_deliveries": [
            {
                "id": r.id,
                "kind": r.kind,
                "reason": r.reason,
                "subscription": r.subscription,
                "broker_message_id": r.broker_message_id,
                "payload_sha256": r.payload_hash.hex() if r.payload_hash else None,
                "created_at": _iso(r.created_at),
                "redriven_at": _iso(r.redriven_at),
                "redriven_by": r.redriven_by,
                "redrive_reason": r.redrive_reason,
                "redrive_outcome": r.redrive_outcome,
                "resolved_at": _iso(r.resolved_at),
                "resolved_by": r.resolved_by,
                "resolution_reason": r.resolution_reason,
                "open": r.open,
            }
            for r in history.rejected
        ],
    }


def _history_lines(history: OperationHistory, absence: str) -> list[str]:
    key, row = history.key, history.row
    lines = [f"operation {key.operation_id!r} of tenant {key.tenant_id!r}"]
    if row is None:
        lines.append(f"work row: none ({absence})")
    else:
        lease = (
            "-"
            if row.lease_owner is None
            else f"{row.lease_owner} until {_at(row.lease_expires_at)}"
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
            [f"  next attempt   {_at(row.next_attempt_at)}"] if row.state is State.QUEUED else []
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
            f"  created        {_at(row.created_at)}",
            f"  last claimed   {_at(row.claimed_at)}",
            f"  settled        {_at(row.settled_at)}",
            f"  updated        {_at(row.updated_at)}",
            f"  payload        {payload}",
            f"  trace id       {trace}",
        ]
    lines.append(f"redrives: {len(history.redrives) or 'none'}")
    lines += [
        f"  {_at(r.at)}  {r.from_state} -> {r.to_state}  fence {r.fence}, attempts {r.attempts}"
        f"  by {r.actor}: {r.reason}"
        for r in history.redrives
    ]
    lines.append(f"rejected deliveries: {len(history.rejected) or 'none'}")
    for r in history.rejected:
        if r.resolved_at is not None:
            closed = f"resolved {_at(r.resolved_at)} by {r.resolved_by}: {r.resolution_reason}"
        elif r.redriven_at is not None:
            closed = f"redriven {_at(r.redriven_at)} by {r.redriven_by} -> {r.redrive_outcome}"
        else:
            closed = "open (awaiting a person)"
        lines.append(f"  #{r.id}  {_at(r.created_at)}  {r.kind}  {r.subscription}  {closed}")
        lines.append(f"      {r.reason}")
    lines.append(
        "not shown: payload bytes, and earlier claims and heartbeats (the row keeps only the "
        "latest claim; see the fence and attempt count)"
    )
    return lines


def _redrive(args: argparse.Namespace) -> int:
    from bridge.config import load_config  # noqa: PLC0415
    from bridge.operations import Redrive  # noqa: PLC0415
    from bridge.types import Key, RedriveFilter  # noqa: PLC0415

    if args.operation is not None and args.tenant is None:
        raise _usage("--operation needs --tenant")
    if args.confirm_not_called and args.operation is None:
        raise _usage("--confirm-not-called applies to one operation: give --tenant and --operation")
    states = tuple(State(s) for s in (args.state or ["unknown", "quarantined"]))
    selection = RedriveFilter(
        states=states,
        subscription=args.subscription,
        tenant_id=args.tenant,
        job_type=args.job_type,
        keys=(Key(args.tenant, args.operation),) if args.operation is not None else None,
        limit=args.limit,
    )
    config = load_config(args.config)
    hasher = _hasher()
    with _store(args) as store:
        # a dry run compares the key but records nothing, not even a first key
        _keyed(store, hasher, record=None if args.dry_run else "redrive")
        report = Redrive(
            store,
            config,
            hasher,
            actor=args.actor or _os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
            extra_attempts=args.extra_attempts,
            confirm_not_called=args.confirm_not_called,
        ).run(selection, deliveries=State.QUARANTINED in states)
    print("\n".join(_redrive_lines(report, hasher)))
    return 0


def _redrive_lines(report: RedriveReport, hasher: IdentityHasher) -> list[str]:
    def who(key: Key | None) -> str:
        return "-" if key is None else " ".join(_log_hashes(hasher, key))

    verb = "would go" if report.dry_run else "->"
    rows: list[list[object]] = []
    for r in report.rows:
        result = f"{verb} {r.to.value}" if r.to is not None else "stays"
        rows.append(
            [
                r.row.state.value,
                r.row.target_class.value,
                r.row.job_type,
                who(r.row.key),
                result,
                r.note,
            ]
        )
    for d in report.deliveries:
        if d.decision is None or d.decision.value == "quarantined":
            result = "stays"
        else:
            result = f"{verb} {d.decision.value}"
        note = (
            d.note
            if d.decision is None or d.decision.value != "quarantined"
            else (f"still quarantined: {d.note}")
        )
        rows.append(
            [f"delivery #{d.delivery.id}", "", d.delivery.subscription, who(d.key), result, note]
        )
    lines = _table(["parked", "class", "job / subscription", "operation", "result", "why"], rows)
    if not rows:
        lines = ["nothing parked matches"]
    summary = f"redrive: {report.moved} moved, {report.left} left parked"
    if report.dry_run:
        summary += " (dry run: nothing was written)"
    return [*lines, summary]


def _resolve(args: argparse.Namespace) -> int:
    from bridge.operations import RejectionFilter, resolve  # noqa: PLC0415

    if args.operation is not None and args.tenant is None:
        raise _usage("--operation needs --tenant")
    if not args.ids and args.kind is None and args.subscription is None and args.tenant is None:
        raise _usage(
            "name the deliveries: their ids (shown by `fencebridge inspect`), or a filter "
            "(--kind, --subscription, --tenant); a resolve never closes everything by default"
        )
    selection = RejectionFilter(
        ids=tuple(args.ids) if args.ids else None,
        kind=args.kind,
        subscription=args.subscription,
        tenant_id=args.tenant,
        operation_id=args.operation,
        limit=args.limit,
    )
    hasher = _hasher()  # the output names operations by keyed hash only
    with _store(args) as store:
        _keyed(store, hasher)
        report = resolve(
            store,
            selection,
            actor=args.actor or _os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    verb = "would resolve" if report.dry_run else "resolved"
    rows = [
        [
            f"#{r.id}",
            r.kind,
            r.subscription,
            "-" if r.key is None else " ".join(_log_hashes(hasher, r.key)),
            _at(r.created_at),
        ]
        for r in report.resolved
    ]
    lines = _table(["delivery", "kind", "subscription", "operation", "recorded"], rows)
    if not rows:
        lines = ["no open rejected delivery matches"]
    lines += [f"#{i}: not resolved: {why}" for i, why in report.not_open]
    summary = f"{verb} {len(report.resolved)} rejected deliveries; work rows untouched"
    if report.dry_run:
        summary += " (dry run: nothing was written)"
    print("\n".join([*lines, summary]))
    return 1 if report.not_open else 0


def _sweep(args: argparse.Namespace) -> int:
    with _store(args) as store:
        hasher = _optional_hasher(store)
        parked = store.sweep(args.limit, exclusive=True)
    print(f"parked {len(parked)} expired last attempt(s) as unknown")
    if parked and hasher is not None:
        for t in parked:
            print(f"  {' '.join(_log_hashes(hasher, t.key))}  fence {t.fence}")
    return 0


def _purge(args: argparse.Namespace) -> int:
    from bridge.operations import purge  # noqa: PLC0415

    older_than: timedelta | None = args.older_than
    if older_than is None:
        from bridge.config import load_config  # noqa: PLC0415

        plan = load_config(args.config).retention
        if plan is None:
            raise _usage(f"{args.config} has no [retention] table; pass --older-than")
        older_than = timedelta(days=plan.purge_after_days)
    with _store(args) as store:
        if args.dry_run:
            counts = store.purge_preview(older_than)
            print(
                f"would purge {counts.work_rows} work row(s), {counts.rejected_deliveries} "
                f"rejected deliveries and {counts.payloads} payload(s) older than "
                f"{_span(older_than)}"
            )
            return 0
        report = purge(store, older_than, batch_size=args.batch_size)
    removed = report.removed
    print(
        f"purged {removed.work_rows} work row(s), {removed.rejected_deliveries} rejected "
        f"deliveries and {removed.payloads} payload(s) older than {_span(older_than)} in "
        f"{report.batches} batch(es)"
    )
    if report.locked_out:
        print("fencebridge purge: another purge is running; this one stopped", file=sys.stderr)
        return 1
    return 0


def _erase(args: argparse.Namespace) -> int:
    hasher = _hasher()
    with _store(args) as store:
        _keyed(store, hasher, record=None if args.dry_run else "erase")
        tenant_hash = hasher.tenant(args.tenant)
        counts = store.erase_tenant(
            args.tenant,
            tenant_hash=tenant_hash,
            actor=args.actor or _os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    verb = "would erase" if args.dry_run else "erased"
    print(
        f"{verb} tenant {tenant_hash}: {counts.work_rows} work row(s), {counts.payloads} "
        f"payload(s), {counts.rejected_deliveries} rejected deliveries, "
        f"{counts.redrive_audits} redrive audit row(s)"
    )
    print("dry run: nothing was written" if args.dry_run else "recorded in erasure_audit")
    return 0


def _identity_status(args: argparse.Namespace) -> int:
    from bridge import keyring  # noqa: PLC0415
    from bridge.identity import REUSE_ADVICE, IdentityHasher, shown  # noqa: PLC0415

    hasher = IdentityHasher.optional_from_env()
    with _store(args) as store:
        uses = keyring.status(store, hasher)
    current = next((u for u in uses if u.current), None)
    fine = current is not None and (hasher is None or current.held == "current")
    if args.json:
        document = {
            "keys": [
                {
                    "key_id": u.key.key_id,
                    "fingerprint": shown(u.key.fingerprint),
                    "current": u.current,
                    "registered_at": _at(u.key.registered_at),
                    "registered_by": u.key.registered_by,
                    "reason": u.key.reason,
                    "open_rows": u.open_rows,
                    "rows": u.rows,
                    "environment": u.held,
                }
                for u in uses
            ],
            "environment_fingerprint": shown(hasher.fingerprint) if hasher else None,
        }
        print(json.dumps(document, indent=2))
        return 0 if fine or hasher is None else 1
    if not uses:
        print("no identity key recorded yet: the first bridge or command that hashes records it")
        print(f"{REUSE_ADVICE[0].upper()}{REUSE_ADVICE[1:]}")
        return 0
    rows = [
        [
            u.key.key_id,
            shown(u.key.fingerprint),
            "current" if u.current else "earlier",
            _at(u.key.registered_at),
            u.key.registered_by,
            u.open_rows,
            u.rows,
            u.held or "-",
        ]
        for u in uses
    ]
    header = ["key", "fingerprint", "use", "recorded", "by", "open rows", "rows", "environment"]
    print("\n".join(_table(header, rows)))
    assert current is not None
    if hasher is None:
        print(f"{IDENTITY_KEY_ENV} is not set: {REUSE_ADVICE}")
    elif current.held != "current":
        print(
            f"{IDENTITY_KEY_ENV} (fingerprint {shown(hasher.fingerprint)}) is not the current key "
            f"(key {current.key.key_id}): {REUSE_ADVICE}"
        )
    return 0 if fine or hasher is None else 1


def _identity_rotate(args: argparse.Namespace) -> int:
    from bridge import keyring  # noqa: PLC0415
    from bridge.identity import IDENTITY_PREVIOUS_KEYS_ENV, shown  # noqa: PLC0415

    hasher = _hasher()
    with _store(args) as store:
        rotation = keyring.rotate(
            store,
            hasher,
            actor=args.actor or _os_user(),
            reason=args.reason,
            dry_run=args.dry_run,
        )
    new = rotation.new
    assert new is not None
    verb = "would record" if rotation.dry_run else "recorded"
    print(f"{verb} key {new.key_id} (fingerprint {shown(new.fingerprint)}) as the current key")
    for k in rotation.previous:
        print(
            f"key {k.key_id} (fingerprint {shown(k.fingerprint)}) keeps its "
            f"{rotation.open_rows.get(k.key_id, 0)} open row(s) and every row written under it"
        )
    if rotation.dry_run:
        print("dry run: nothing was written")
        return 0
    print(
        f"next: restart every bridge, and run every command, with {IDENTITY_KEY_ENV} set to the "
        f"new key and {IDENTITY_PREVIOUS_KEYS_ENV} to the earlier key(s); until restarted, a "
        "bridge keeps working on its own key's rows and refuses to start again"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from bridge.check import evaluate, read_database  # noqa: PLC0415
    from bridge.config import load_config  # noqa: PLC0415
    from bridge.errors import ConfigError  # noqa: PLC0415

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"NO-GO: the configuration is refused: {exc}")
        return 1
    with connect(database_url(args.database_url)) as conn:
        facts = read_database(conn)
    report = evaluate(config, facts)
    print("\n".join(_check_lines(report)))
    return 0 if report.go else 1


def _check_lines(report: Report) -> list[str]:
    rows = [
        [
            f.job_type,
            f.control.number,
            f.control.title,
            "go" if f.verdict.go else "NO-GO",
            f.verdict.evidence,
        ]
        for f in report.findings
    ]
    lines = _table(["job type", "#", "control", "verdict", "evidence"], rows)
    jobs = sorted({f.job_type for f in report.findings})
    if report.go:
        lines.append(f"GO: all 9 controls hold for {len(jobs)} job type(s)")
    else:
        failed: dict[str, list[str]] = {}
        for f in report.no_go:
            failed.setdefault(f.job_type, []).append(str(f.control.number))
        which = "; ".join(f"{j}: {', '.join(n)}" for j, n in failed.items())
        lines.append(f"NO-GO: {len(report.no_go)} control(s) fail ({which})")
    return lines


class _UsageError(Exception):
    pass


def _usage(message: str) -> _UsageError:
    return _UsageError(message)


def _add_database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help=f"libpq URL of the database (default: ${DATABASE_URL_ENV})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencebridge",
        description="Broker deliveries become fenced work rows in PostgreSQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "migrate", help="apply the schema migrations (idempotent; an operator's command)"
    )
    _add_database_flag(p)
    p.set_defaults(run=_migrate)

    p = commands.add_parser(
        "run",
        help="run the bridge: consumers, worker pool, sweeper (SIGTERM/SIGINT drain and exit 0)",
        description=(
            f"Secrets come from the environment: ${DATABASE_URL_ENV} and ${IDENTITY_KEY_ENV} "
            "(the key of idempotency keys and of hashed identifiers in logs: the deployment's "
            "key, which the database checks; change it only with `fencebridge identity "
            "rotate`)."
        ),
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    _add_database_flag(p)
    p.set_defaults(run=_run)

    p = commands.add_parser(
        "demo",
        help="the whole protocol on an embedded PostgreSQL, a local SQS and a payment provider",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep everything running afterwards, write bridge.toml and demo.env for the "
        "operator commands and print what to try (Ctrl-C stops it)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        help="with --keep: the directory for bridge.toml and demo.env (created if missing; "
        "default: a fresh temporary directory, removed on exit)",
    )
    p.add_argument(
        "--broker",
        choices=("sqs", "pubsub"),
        default="sqs",
        help="sqs: a local SQS server (moto); pubsub: Google's Pub/Sub emulator (needs Java)",
    )
    p.set_defaults(run=_demo)
    _add_operator_commands(commands)
    _add_identity_commands(commands)
    return parser


def _add_resolve_command(commands: Any, key_note: str) -> None:
    p = commands.add_parser(
        "resolve",
        help="close rejected deliveries a person has dealt with (audited; work rows untouched)",
        description=(
            "A conflict (same operation id, another payload) changed nothing; once its producer "
            "has been told, resolve it so it stops awaiting a person. A quarantined delivery "
            "given up on is resolved the same way (redrive re-decodes one instead). Each is "
            f"marked acknowledged with actor and reason; nothing else changes. {key_note}"
        ),
    )
    p.add_argument(
        "ids", nargs="*", type=_positive, metavar="ID", help="rejected delivery ids (inspect)"
    )
    p.add_argument("--reason", type=_text, required=True, help="why: recorded on each delivery")
    p.add_argument("--actor", type=_text, help="who: recorded (default: the OS user)")
    p.add_argument("--dry-run", action="store_true", help="show what would close; write nothing")
    p.add_argument("--kind", choices=["conflict", "quarantined"], help="only this kind")
    p.add_argument("--subscription", type=_text, help="only this subscription")
    p.add_argument("--tenant", type=_text, help="only this tenant")
    p.add_argument("--operation", type=_text, help="only this operation (with --tenant)")
    p.add_argument("--limit", type=_positive, default=100, help="most deliveries per run")
    _add_database_flag(p)
    p.set_defaults(run=_resolve)


def _add_operator_commands(commands: Any) -> None:
    key_note = f"Tenants and operations are shown as keyed hashes: ${IDENTITY_KEY_ENV} must be set."

    p = commands.add_parser(
        "status",
        help="counts by state per subscription and tenant hash; stalled claims; oldest unknown",
        description=key_note,
    )
    p.add_argument("--json", action="store_true", help="print a JSON document instead")
    _add_database_flag(p)
    p.set_defaults(run=_status)

    p = commands.add_parser(
        "inspect",
        help="one operation's history: its row, its redrives, its rejected deliveries",
        description="Never prints payload bytes: their size and sha256 only.",
    )
    p.add_argument("tenant", type=_text, help="the tenant id")
    p.add_argument("operation", type=_text, help="the operation id")
    p.add_argument("--json", action="store_true", help="print a JSON document instead")
    _add_database_flag(p)
    p.set_defaults(run=_inspect)

    p = commands.add_parser(
        "redrive",
        help="send parked work back, reconciling unknown rows first (audited)",
        description=(
            "unknown class C rows are looked up by idempotency key first (applied -> succeeded, "
            "not applied -> queued, cannot tell -> stays); unknown class D rows with a "
            "recorded intent stay unless --confirm-not-called; class A/B unknown and "
            "quarantined rows go back to the queue; quarantined deliveries are decoded again "
            f"with the current rules. {key_note}"
        ),
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    p.add_argument("--reason", type=_text, required=True, help="why: recorded in the audit")
    p.add_argument("--actor", type=_text, help="who: recorded in the audit (default: the OS user)")
    p.add_argument("--dry-run", action="store_true", help="show what would happen; write nothing")
    p.add_argument(
        "--state",
        action="append",
        choices=["unknown", "quarantined"],
        help="parked state to redrive (repeatable; default both; quarantined includes "
        "quarantined deliveries)",
    )
    p.add_argument("--subscription", type=_text, help="only this subscription")
    p.add_argument("--tenant", type=_text, help="only this tenant")
    p.add_argument("--operation", type=_text, help="only this operation (with --tenant)")
    p.add_argument("--job-type", type=_text, help="only this job type")
    p.add_argument(
        "--limit", type=_positive, default=100, help="most rows (and deliveries) per run"
    )
    p.add_argument(
        "--extra-attempts",
        type=_positive,
        default=1,
        help="attempts granted to each row (default 1)",
    )
    p.add_argument(
        "--confirm-not-called",
        action="store_true",
        help="class D: the target's owner confirmed the recorded call did not happen; clears "
        "the intent of the one operation named by --tenant and --operation",
    )
    _add_database_flag(p)
    p.set_defaults(run=_redrive)

    _add_resolve_command(commands, key_note)

    p = commands.add_parser(
        "sweep", help="park expired last attempts as unknown now (one sweeper at a time)"
    )
    p.add_argument("--limit", type=_positive, default=1000, help="most rows parked by this sweep")
    _add_database_flag(p)
    p.set_defaults(run=_sweep)

    p = commands.add_parser(
        "purge",
        help="delete finished rows and their payloads by age, in batches (never unknown or "
        "quarantined)",
    )
    age = p.add_mutually_exclusive_group(required=True)
    age.add_argument("--older-than", type=_duration, help="age since settlement: 90d, 36h, 30m")
    age.add_argument("--config", help="take the age from [retention] purge_after_days")
    p.add_argument("--batch-size", type=_positive, default=500, help="rows per batch transaction")
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    _add_database_flag(p)
    p.set_defaults(run=_purge)

    p = commands.add_parser(
        "erase",
        help="erase one tenant: work rows, payloads, rejected deliveries, audit rows (audited)",
        description=f"The erasure is recorded with the tenant's keyed hash. {key_note}",
    )
    p.add_argument("--tenant", type=_text, required=True, help="the tenant id to erase")
    p.add_argument(
        "--reason", type=_text, required=True, help="why (the request reference): recorded"
    )
    p.add_argument("--actor", type=_text, help="who: recorded (default: the OS user)")
    p.add_argument("--dry-run", action="store_true", help="count what would go; erase nothing")
    _add_database_flag(p)
    p.set_defaults(run=_erase)

    p = commands.add_parser(
        "check",
        help="the nine go/no-go controls per job type; exits 1 on any no-go",
        description="All required, never a score: one no-go makes the answer no-go.",
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    _add_database_flag(p)
    p.set_defaults(run=_check)


def _add_identity_commands(commands: Any) -> None:
    p = commands.add_parser(
        "identity",
        help="the identity keys the database was written under: status, rotate",
        description=(
            f"Each {IDENTITY_KEY_ENV} is recorded in the database by its fingerprint (never the "
            "key); every row keeps the key it was written under."
        ),
    )
    identity = p.add_subparsers(dest="identity_command", required=True, metavar="ACTION")
    q = identity.add_parser(
        "status",
        help="recorded keys: id, fingerprint prefix, open and total rows, which one this "
        "environment holds (needs no key)",
    )
    q.add_argument("--json", action="store_true", help="print a JSON document instead")
    _add_database_flag(q)
    q.set_defaults(run=_identity_status)
    q = identity.add_parser(
        "rotate",
        help="record a new current key for new operations; existing rows keep theirs (audited)",
        description=(
            f"Run with {IDENTITY_KEY_ENV} set to the new key and "
            "FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS to the current key (comma-separated, with any "
            "earlier key that open rows still use). Then restart every bridge with the same two "
            "variables."
        ),
    )
    q.add_argument("--reason", type=_text, required=True, help="why: recorded with the key")
    q.add_argument("--actor", type=_text, help="who: recorded (default: the OS user)")
    q.add_argument("--dry-run", action="store_true", help="check everything; record nothing")
    _add_database_flag(q)
    q.set_defaults(run=_identity_rotate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging()
    run: Command = args.run
    try:
        code = run(args)
        sys.stdout.flush()  # a closed pipe is found here, not at exit where it cannot be caught
    except BrokenPipeError:
        # The reader closed the pipe: what is left is for nobody. Point stdout at /dev/null so
        # that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except _UsageError as exc:
        parser.error(f"{args.command}: {exc}")
    except FenceBridgeError as exc:
        print(f"fencebridge {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
