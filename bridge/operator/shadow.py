"""Shadow subscriptions: run beside the existing mechanism on a copy of its stream, execute
nothing, and compare.

The seed's rollout asks to "run the claim table alongside the existing mechanism and compare
which jobs each would have double-run; do not switch the system of record until the comparison
is clean". A subscription with ``mode = "shadow"`` reads a copy of the stream (an SNS fan-out to
a second SQS queue, a second Pub/Sub subscription on the topic): its deliveries are decoded and
decided exactly as the inbox decides them, and recorded in ``shadow_operation`` and
``shadow_delivery`` (:class:`~bridge.ingest.shadow.ShadowWrites`), which no claim reads: no handler
is called, no target sees a request. Going live is a configuration change and a restart.

:func:`compare` sets that record against the existing system's **effect log**: one entry per
effect it applied, with at least ``tenant``, ``operation`` and ``applied_at``, and optionally
``payload_hash`` (the hex sha256 of the payload it applied, over the same bytes the
subscription hashes). Per job type it reports what the inbox saw (deliveries, operations,
replays and conflicts it would have caught, deliveries it could not decode) and what the
existing system did that fencebridge would not have (operations applied more than once, applied
with a payload other than the first one seen, never applied). Neither side is ever held whole:
both come in key order (the record from the database, the log sorted by :func:`in_key_order` or
by the database) and are merged one operation at a time, so a report over months of a busy
stream needs no more memory than one over a day.
"""

from __future__ import annotations

import csv
import heapq
import json
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby, islice
from pathlib import Path
from typing import IO, Any, Final, TypeVar

from bridge.errors import EffectLogError, StoreError
from bridge.store.records import SeenOperation
from bridge.types import Key

#: the effect log's columns: the first three are required
EFFECT_COLUMNS = ("tenant", "operation", "applied_at", "payload_hash")
#: the job type row of deliveries whose job type could not be read
UNDECODED_JOB_TYPE = "-"
#: operations the report lists per finding and job type, unless told otherwise (all counted)
LISTED_DEFAULT: Final = 100
#: effects of a log sorted in memory at once; a longer log is sorted in runs on disk
SORT_RUN_DEFAULT: Final = 100_000
#: sorted runs merged at once (each an open file)
MERGE_FAN_IN: Final = 64

T = TypeVar("T")


# -- the effect log ----------------------------------------------------------------------------


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


def read_effect_file(path: Path) -> Generator[Effect, None, None]:
    """A CSV file with a header row, or JSON Lines (``.jsonl``, ``.ndjson``): one effect each,
    read as they are taken (the file is never held whole). A file that cannot be opened, or a
    CSV header without the required columns, is refused here; a bad entry when it is reached."""
    if path.suffix not in (".csv", ".jsonl", ".ndjson"):
        raise EffectLogError(f"{path}: an effect log is a .csv, .jsonl or .ndjson file")
    try:
        f = path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise EffectLogError(f"{path}: cannot read the effect log ({exc.strerror})") from exc
    try:
        entries = _csv_rows(f, path) if path.suffix == ".csv" else _json_lines(f, path)
    except BaseException:
        f.close()
        raise
    return _closing(f, path, entries)


def _csv_rows(f: IO[str], path: Path) -> Iterator[Effect]:
    """The rows of a CSV effect log; its header is checked now, the rows as they are read."""
    with _unreadable(path):
        reader = csv.DictReader(f)
        found = reader.fieldnames or ()
    absent = [c for c in EFFECT_COLUMNS[:3] if c not in found]
    if absent:
        raise EffectLogError(
            f"{path}: the header has no {', '.join(absent)} column "
            f"(found: {', '.join(found) or 'no header'})"
        )
    return (effect(row, f"{path}:{n}") for n, row in enumerate(reader, start=2))


def _closing(f: IO[str], path: Path, entries: Iterator[Effect]) -> Generator[Effect, None, None]:
    """``entries`` as they are read from ``f``, which closes when they end or are dropped."""
    with f, _unreadable(path):
        yield from entries


@contextmanager
def _unreadable(path: Path) -> Iterator[None]:
    """A file that fails mid-way, or is not UTF-8, is a clear error naming it."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise EffectLogError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise EffectLogError(f"{path}: cannot read the effect log ({exc.strerror})") from exc


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
class Listing:
    """The operations of one finding: how many there are, and the first ``limit`` of them in
    key order with the times each was applied (the rest are counted, not kept)."""

    total: int = 0
    first: list[tuple[Key, int]] = field(default_factory=list)

    def add(self, key: Key, times: int, limit: int) -> None:
        self.total += 1
        if len(self.first) < limit:
            self.first.append((key, times))


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
    #: operations the existing system applied more than once
    applied_more_than_once: Listing = field(default_factory=Listing)
    #: operations it applied with a payload other than the first one fencebridge saw
    applied_with_other_payload: Listing = field(default_factory=Listing)
    #: operations fencebridge saw that it never applied
    never_applied: Listing = field(default_factory=Listing)


@dataclass
class Comparison:
    job_types: dict[str, JobComparison]
    #: effects of operations no shadow subscription saw (another stream, or before the shadow
    #: started): not compared
    effects_not_seen: int
    #: effects whose log records no payload hash: a payload difference cannot be told for them
    effects_without_hash: int
    #: operations listed per finding and job type at most (all are counted)
    limit: int


def compare(
    decisions: Iterable[tuple[str | None, str, int]],
    seen: Iterable[SeenOperation],
    effects: Iterable[Effect],
    *,
    limit: int = LISTED_DEFAULT,
) -> Comparison:
    """Set the shadow record (``decisions``: job type, decision, deliveries; ``seen``: the
    operations, one per key) against the existing system's effects.

    ``seen`` and ``effects`` come in key order (:func:`key_order`: the store reads the record
    so, :func:`in_key_order` sorts a file) and are merged as they come, so the comparison
    holds one operation and its effects at a time, whatever the size of either side; a stream
    out of order is an error, never a wrong report.
    """
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

    def found(op: SeenOperation, times: int, other_payload: bool) -> None:
        line = job(op.job_type)
        line.operations += 1
        if times == 0:
            line.never_applied.add(op.key, times, limit)
        if times > 1:
            line.applied_more_than_once.add(op.key, times, limit)
        if other_payload:
            line.applied_with_other_payload.add(op.key, times, limit)

    operations = _ascending(seen, lambda op: key_order(op.key), "the shadow record", strict=True)
    ordered = _ascending(effects, lambda e: key_order(e.key), "the effect log", strict=False)
    not_seen = without_hash = 0
    op = next(operations, None)
    for key, group in groupby(ordered, key=lambda e: key_order(e.key)):
        while op is not None and key_order(op.key) < key:
            found(op, 0, other_payload=False)
            op = next(operations, None)
        if op is None or key_order(op.key) > key:
            not_seen += sum(1 for _ in group)
            continue
        times, other = 0, False
        for e in group:
            times += 1
            if e.payload_hash is None:
                without_hash += 1
            elif e.payload_hash != op.payload_hash:
                other = True
        found(op, times, other_payload=other)
        op = next(operations, None)
    while op is not None:
        found(op, 0, other_payload=False)
        op = next(operations, None)
    return Comparison(dict(sorted(jobs.items())), not_seen, without_hash, limit)


def key_order(key: Key) -> tuple[str, str]:
    """The order both sides of the comparison come in: tenant, then operation, by code point
    (the byte order of their UTF-8, which is PostgreSQL's ``COLLATE "C"``)."""
    return key.tenant_id, key.operation_id


def _ascending(
    items: Iterable[T], order: Callable[[T], tuple[str, str]], what: str, *, strict: bool
) -> Iterator[T]:
    """``items``, checked to come in ``order`` (each key once when ``strict``)."""
    last: tuple[str, str] | None = None
    for item in items:
        here = order(item)
        if last is not None and (here < last or (strict and here == last)):
            raise StoreError(f"shadow report: {what} is not in key order; nothing was compared")
        last = here
        yield item


# -- an effect log in key order -----------------------------------------------------------------


def in_key_order(
    effects: Iterable[Effect], *, run: int = SORT_RUN_DEFAULT, fan_in: int = MERGE_FAN_IN
) -> Generator[Effect, None, None]:
    """``effects`` in :func:`key_order`, with at most ``run`` of them in memory at once.

    An effect log is the existing system's own record and may hold every effect it ever
    applied. One that fits in a run is sorted in memory; a longer one is cut into runs, each
    sorted and written to a temporary file (its entries only: key, applied_at, payload hash),
    and the files are merged, at most ``fan_in`` at once. The files hold what the
    log holds, in a directory only this user can read, removed when the merge ends.
    """
    if run < 1 or fan_in < 2:
        raise ValueError(f"a run holds at least one effect ({run}), a merge two runs ({fan_in})")
    entries = iter(effects)
    first = sorted(islice(entries, run), key=lambda e: key_order(e.key))
    if len(first) < run:
        yield from first
        return
    with tempfile.TemporaryDirectory(prefix="fencebridge-effects-") as directory:
        spill = _Spill(Path(directory))
        runs = [spill.write(first)]
        del first  # one run in memory at a time: each is let go before the next is read
        while chunk := sorted(islice(entries, run), key=lambda e: key_order(e.key)):
            runs.append(spill.write(chunk))
            del chunk
        while len(runs) > fan_in:
            runs = [*runs[fan_in:], spill.write(spill.merge(runs[:fan_in]))]
        yield from spill.merge(runs)


class _Spill:
    """Sorted runs of effects in files of one directory: one JSON array per line."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._made = 0

    def write(self, effects: Iterable[Effect]) -> Path:
        self._made += 1
        path = self._directory / f"run-{self._made}.jsonl"
        try:
            with path.open("w", encoding="utf-8") as f:
                for e in effects:
                    digest = None if e.payload_hash is None else e.payload_hash.hex()
                    f.write(json.dumps([*key_order(e.key), e.applied_at, digest]) + "\n")
        except OSError as exc:
            raise EffectLogError(
                f"cannot sort the effect log in {self._directory.parent} ({exc.strerror}); "
                "set TMPDIR to a directory with room"
            ) from exc
        return path

    def merge(self, runs: Sequence[Path]) -> Iterator[Effect]:
        """The runs' effects in key order; each file is removed once read."""
        with ExitStack() as stack:
            readers = [self._read(stack.enter_context(p.open(encoding="utf-8"))) for p in runs]
            yield from heapq.merge(*readers, key=lambda e: key_order(e.key))
        for p in runs:
            p.unlink()

    @staticmethod
    def _read(lines: Iterable[str]) -> Iterator[Effect]:
        for line in lines:
            tenant, operation, applied_at, digest = json.loads(line)
            payload_hash = None if digest is None else bytes.fromhex(digest)
            yield Effect(Key(tenant, operation), applied_at, payload_hash)
