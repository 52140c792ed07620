"""Shadow subscriptions: run beside the existing mechanism on a copy of its stream, execute
nothing, and compare.

The seed's rollout asks to "run the claim table alongside the existing mechanism and compare
which jobs each would have double-run; do not switch the system of record until the comparison
is clean". A subscription with ``mode = "shadow"`` reads a copy of the stream (an SNS fan-out to
a second SQS queue, a second Pub/Sub subscription on the topic): its deliveries are decoded and
decided exactly as the inbox decides them, and recorded in ``shadow_operation`` and
``shadow_delivery`` (:class:`ShadowWrites`), which no claim reads: no handler is called, no
target sees a request. Going live is a configuration change and a restart.

:func:`compare` sets that record against the existing system's **effect log**: one entry per
effect it applied, with at least ``tenant``, ``operation`` and ``applied_at``, and optionally
``payload_hash`` (the hex sha256 of the payload it applied, over the same bytes the
subscription hashes). Per job type it reports what the inbox saw (deliveries, operations,
replays and conflicts it would have caught, deliveries it could not decode) and what the
existing system did that fencebridge would not have (operations applied more than once, applied
with a payload other than the first one seen, never applied).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.errors import ConfigError
from bridge.records import SeenOperation
from bridge.types import Delivery, IngestResult, InsertClaim, Key, Rejection

if TYPE_CHECKING:
    from bridge.store.work import QuotaDeferred, WorkStore

#: the effect log's columns: the first three are required
EFFECT_COLUMNS = ("tenant", "operation", "applied_at", "payload_hash")
#: the job type row of deliveries whose job type could not be read
UNDECODED_JOB_TYPE = "-"


class ShadowWrites:
    """The inbox store of a shadow subscription: every batch goes to the shadow record.

    A shadow copy is never deferred by the tenant backlog quota (the quota guards live work),
    and nothing is handed to the worker pool.
    """

    def __init__(self, store: WorkStore) -> None:
        self._store = store

    def ingest(
        self, batch: Sequence[Delivery | Rejection], claim: InsertClaim | None = None
    ) -> list[IngestResult]:
        _unclaimed(claim)
        return self._store.ingest_shadow(batch)

    def ingest_within_quota(
        self, batch: Sequence[Delivery | Rejection], quota: int, claim: InsertClaim | None = None
    ) -> list[IngestResult | QuotaDeferred]:
        _unclaimed(claim)
        return list(self._store.ingest_shadow(batch))


def _unclaimed(claim: InsertClaim | None) -> None:
    """A shadow record is never run: a pool asking to claim from it is a wiring error."""
    if claim is not None:
        raise TypeError("a shadow subscription's deliveries are never claimed")


# -- the effect log ----------------------------------------------------------------------------


class EffectLogError(ConfigError):
    """The effect log cannot be read as documented (a missing column, a bad value)."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect the existing system applied."""

    key: Key
    applied_at: str
    #: sha256 of the payload it applied, when the log records it
    payload_hash: bytes | None = None


def effect(entry: Mapping[str, Any], where: str) -> Effect:
    """One entry of an effect log, checked; ``where`` names it in an error."""
    missing = [c for c in EFFECT_COLUMNS[:3] if entry.get(c) in (None, "")]
    if missing:
        raise EffectLogError(f"{where}: no {', '.join(missing)} (required: tenant, operation, "
                             "applied_at; optional: payload_hash)")  # fmt: skip
    applied_at = entry["applied_at"]
    if isinstance(applied_at, datetime):
        applied_at = applied_at.isoformat()
    digest = entry.get("payload_hash")
    payload_hash = None
    if digest not in (None, ""):
        try:
            payload_hash = bytes.fromhex(str(digest))
        except ValueError:
            payload_hash = b""
        if len(payload_hash) != 32:
            raise EffectLogError(
                f"{where}: payload_hash is not a hex sha256 (64 hex digits): {str(digest)[:80]!r}"
            )
    return Effect(Key(str(entry["tenant"]), str(entry["operation"])), str(applied_at), payload_hash)


def read_effect_file(path: Path) -> list[Effect]:
    """A CSV file with a header row, or JSON Lines (``.jsonl``, ``.ndjson``): one effect each."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            if path.suffix in (".jsonl", ".ndjson"):
                return list(_json_lines(f, path))
            if path.suffix == ".csv":
                reader = csv.DictReader(f)
                absent = [c for c in EFFECT_COLUMNS[:3] if c not in (reader.fieldnames or ())]
                if absent:
                    raise EffectLogError(
                        f"{path}: the header has no {', '.join(absent)} column "
                        f"(found: {', '.join(reader.fieldnames or ()) or 'no header'})"
                    )
                return [effect(row, f"{path}:{n}") for n, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise EffectLogError(f"{path}: cannot read the effect log ({exc.strerror})") from exc
    raise EffectLogError(f"{path}: an effect log is a .csv, .jsonl or .ndjson file")


def _json_lines(lines: Iterable[str], path: Path) -> Iterator[Effect]:
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EffectLogError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(entry, dict):
            raise EffectLogError(f"{path}:{n}: not a JSON object")
        yield effect(entry, f"{path}:{n}")


# -- the comparison ----------------------------------------------------------------------------


@dataclass
class JobComparison:
    """One job type's line of the report."""

    job_type: str
    deliveries: int = 0
    operations: int = 0
    #: deliveries the inbox would have taken for replays (no new work)
    replays: int = 0
    #: deliveries with another payload than the operation's first (rejected, nothing changed)
    conflicts: int = 0
    #: deliveries the rules could not decode (they would have been quarantined)
    undecodable: int = 0
    #: operations the existing system applied more than once, with how many times
    applied_more_than_once: dict[Key, int] = field(default_factory=dict)
    #: operations it applied with a payload other than the first one fencebridge saw
    applied_with_other_payload: list[Key] = field(default_factory=list)
    #: operations fencebridge saw that it never applied
    never_applied: list[Key] = field(default_factory=list)


@dataclass
class Comparison:
    job_types: dict[str, JobComparison]
    #: effects of operations no shadow subscription saw (another stream, or before the shadow
    #: started): not compared
    effects_not_seen: int
    #: effects whose log records no payload hash: a payload difference cannot be told for them
    effects_without_hash: int


def compare(
    decisions: Iterable[tuple[str | None, str, int]],
    seen: Iterable[SeenOperation],
    effects: Iterable[Effect],
) -> Comparison:
    """Set the shadow record (``decisions``: job type, decision, deliveries; ``seen``: the
    operations) against the existing system's effects."""
    jobs: dict[str, JobComparison] = {}

    def job(name: str | None) -> JobComparison:
        name = name or UNDECODED_JOB_TYPE
        return jobs.setdefault(name, JobComparison(name))

    for job_type, decision, count in decisions:
        line = job(job_type)
        line.deliveries += count
        if decision == "replay":
            line.replays += count
        elif decision == "conflict":
            line.conflicts += count
        elif decision == "quarantined":
            line.undecodable += count
    applied: dict[Key, list[Effect]] = defaultdict(list)
    for e in effects:
        applied[e.key].append(e)
    operations: dict[Key, SeenOperation] = {}
    for op in seen:
        operations.setdefault(op.key, op)
    without_hash = 0
    for key, op in sorted(operations.items(), key=lambda kv: (kv[0].tenant_id, kv[0].operation_id)):
        line = job(op.job_type)
        line.operations += 1
        done = applied.get(key, [])
        if not done:
            line.never_applied.append(key)
        if len(done) > 1:
            line.applied_more_than_once[key] = len(done)
        if any(e.payload_hash is not None and e.payload_hash != op.payload_hash for e in done):
            line.applied_with_other_payload.append(key)
        without_hash += sum(e.payload_hash is None for e in done)
    not_seen = sum(len(v) for k, v in applied.items() if k not in operations)
    return Comparison(dict(sorted(jobs.items())), not_seen, without_hash)
