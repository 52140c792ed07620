"""``fencebridge check --probe``: controls 3, 4 and 8 decided by evidence that ran.

Reading the shipped statements shows what they say, not what they do, and an installed consumer
says nothing about when it acknowledges. The probe runs the seeds' evidence instead:

* control 3 (atomic claim): one claim holds its rows in an open transaction while a second
  claim runs on another connection, which must take other rows without waiting for them; then
  many workers, each on its own connection, claim and settle the same queued rows until none is
  left, and no row may be claimed twice;
* control 4 (fenced writes): a claim's lease is ended, another claim takes the row over, and the
  first claim's settlement (its stale fence) must be refused while the current one applies;
* control 8 (ack after commit): each configured subscription's adapter drives one delivery
  through its own receive, write and acknowledge path against an in-process stand-in of its
  broker client, once with an inbox whose COMMIT fails (the stand-in must record no
  acknowledgement) and once with one that commits (it must record one: the path was driven).

Everything runs in a scratch schema of the configured database (``fencebridge_probe_<hex>``),
migrated for the run and dropped with CASCADE afterwards, whatever happened. The probe's
connections see only that schema (their ``search_path``), so no live row is read or written.
It needs the right to create a schema in the database (``CREATE`` on it).

The claim and the fenced settlement it runs come from a mapping (:func:`shipped_statements`
unless told otherwise), and the adapters from a lookup (:func:`bridge.adapters.sources.adapter`), so
a test can hand it a claim without ``SKIP LOCKED``, a settlement without the fence condition or
an adapter that acknowledges first, and see the control fail.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Final, LiteralString

from psycopg import conninfo
from psycopg import sql as pgsql

from bridge import sql
from bridge.adapters import sources
from bridge.config import BridgeConfig, SubscriptionConfig
from bridge.database import Connection, SessionTimeouts, connect, translate_errors
from bridge.errors import FenceBridgeError
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.types import Delivery, TargetClass

CLAIM: Final = "claim"
SETTLE: Final = "settle"
WORKERS_DEFAULT: Final = 16
ROWS_DEFAULT: Final = 500
#: rows one claim asks for
CLAIM_BATCH: Final = 5
#: how long the probe waits for a claimer, a barrier or another migrator before it gives up
PATIENCE: Final = 30.0
_LEASE: Final = timedelta(minutes=5)
_HISTORY: Final = 2
_TIMEOUTS: Final = SessionTimeouts(
    statement=timedelta(seconds=60),
    lock=timedelta(seconds=60),
    idle_in_transaction=timedelta(seconds=120),
)
_TENANT: Final = "fencebridge-probe"
_SUBSCRIPTION: Final = "fencebridge-probe"
_WORKER: Final = "fencebridge-probe"
#: the probe's job types in its scratch schema, one per run, so the runs never meet
_HELD: Final = "probe_held"
_CONCURRENT: Final = "probe_concurrent"
_FENCE: Final = "probe_fence"
_INGEST_CHUNK: Final = 100

#: statement name -> text, for the statements whose evidence the probe runs
Statements = Mapping[str, LiteralString]
#: ``source`` -> its adapter
AdapterLookup = Callable[[str], sources.SourceAdapter]
_Claimed = tuple[str, str, int]


def shipped_statements() -> dict[str, LiteralString]:
    """The claim and the fenced settlement this fencebridge ships (``store/<name>.sql``)."""
    return {CLAIM: sql.statement(CLAIM), SETTLE: sql.statement(SETTLE)}


@dataclass(frozen=True, slots=True)
class Evidence:
    """One control's executed evidence: whether it held, and what ran and what it showed."""

    go: bool
    ran: str


@dataclass(frozen=True, slots=True)
class ProbeReport:
    claim: Evidence
    fence: Evidence
    #: control 8, by subscription name
    acks: Mapping[str, Evidence]
    #: the scratch schema it ran in (already dropped)
    schema: str


@dataclass(frozen=True, slots=True)
class Scratch:
    """The scratch schema, and a connection string whose sessions see only it."""

    name: str
    url: str

    def connect(self) -> Connection:
        return connect(self.url, timeouts=_TIMEOUTS)

    def store(self, size: int) -> PostgresStore:
        return PostgresStore.connect(
            self.url, max_size=size, timeouts=_TIMEOUTS, attempt_history=_HISTORY
        )


def run(
    url: str,
    config: BridgeConfig,
    *,
    statements: Statements | None = None,
    adapter: AdapterLookup = sources.adapter,
    workers: int = WORKERS_DEFAULT,
    rows: int = ROWS_DEFAULT,
) -> ProbeReport:
    """Run the evidence of controls 3, 4 and 8 in a scratch schema of ``url``'s database.

    A probe that cannot run (no right to create a schema, say) fails every control it speaks
    for, with the reason; each control's evidence is run and judged on its own.
    """
    texts: Statements = {**shipped_statements(), **(statements or {})}
    name = f"fencebridge_probe_{secrets.token_hex(6)}"
    try:
        with scratch_schema(url, name) as scratch:
            return ProbeReport(
                claim=_judged("claim", lambda: _claim_evidence(scratch, texts, workers, rows)),
                fence=_judged("fence", lambda: _fence_evidence(scratch, texts)),
                acks={
                    sub_name: _judged(
                        sub_name, partial(_ack_evidence, scratch, config, sub, adapter)
                    )
                    for sub_name, sub in sorted(config.subscriptions.items())
                },
                schema=name,
            )
    except FenceBridgeError as exc:
        failed = Evidence(False, f"the probe could not run: {exc}")
        return ProbeReport(failed, failed, dict.fromkeys(config.subscriptions, failed), name)


@contextmanager
def scratch_schema(url: str, name: str) -> Iterator[Scratch]:
    """Create and migrate the schema ``name``; drop it (CASCADE) on the way out, always."""
    schema = pgsql.Identifier(name)
    with connect(url) as admin:
        with translate_errors("probe: create its scratch schema"):
            admin.execute(pgsql.SQL(sql.statement("probe_schema_create")).format(schema=schema))
        try:
            scratch = Scratch(name, _within(url, name))
            with connect(scratch.url) as conn:
                migrate(conn, other_migrator=timedelta(seconds=PATIENCE))
            yield scratch
        finally:
            with translate_errors("probe: drop its scratch schema"):
                admin.execute(pgsql.SQL(sql.statement("probe_schema_drop")).format(schema=schema))


def _within(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` alone (its other options kept)."""
    theirs = conninfo.conninfo_to_dict(url).get("options")
    ours = f"-c search_path={schema}"
    return conninfo.make_conninfo(url, options=f"{theirs} {ours}" if theirs else ours)


def _judged(what: str, evidence: Callable[[], Evidence]) -> Evidence:
    """Run one control's evidence; an error it raises fails that control, not the others."""
    try:
        return evidence()
    except FenceBridgeError as exc:
        return Evidence(False, f"the {what} probe failed: {exc}")


# -- control 3: atomic claim --------------------------------------------------------------------


def _claim_evidence(scratch: Scratch, texts: Statements, workers: int, rows: int) -> Evidence:
    store = scratch.store(2)
    try:
        _queue(store, _HELD, 2 * CLAIM_BATCH)
        _queue(store, _CONCURRENT, rows)
    finally:
        store.close()
    problems, seen = _held_rows(scratch, texts)
    more_problems, more_seen = _concurrent_claims(scratch, texts, workers, rows)
    problems += more_problems
    seen += more_seen
    return Evidence(not problems, "; ".join(problems or seen))


def _held_rows(scratch: Scratch, texts: Statements) -> tuple[list[str], list[str]]:
    """A claim holds its rows, uncommitted; a second claim must skip them, without waiting."""
    taken: list[_Claimed] = []
    failed: list[str] = []
    done = threading.Event()
    with scratch.connect() as holder, scratch.connect() as other, scratch.connect() as watcher:

        def second() -> None:
            try:
                taken.extend(_claim(other, texts, _HELD, CLAIM_BATCH))
            except FenceBridgeError as exc:
                failed.append(str(exc))
            finally:
                done.set()

        thread = threading.Thread(target=second, name="fencebridge-probe-claim", daemon=True)
        with translate_errors("probe: claim"), holder.transaction():
            held = _claim(holder, texts, _HELD, CLAIM_BATCH)
            thread.start()
            waited = _seen_waiting(watcher, other.info.backend_pid, done)
        if thread.ident is not None:
            thread.join(PATIENCE)
    problems: list[str] = []
    if not held:
        problems.append("a claim of queued rows claimed nothing")
    if waited:
        problems.append("a claim waited for the rows another open claim held (no SKIP LOCKED)")
    if failed:
        problems.append(f"the second claim failed: {failed[0]}")
    elif not done.is_set():
        problems.append(f"the second claim did not return within {PATIENCE:g}s")
    twice = {(t, o) for t, o, _ in held} & {(t, o) for t, o, _ in taken}
    if twice:
        problems.append(f"{len(twice)} row(s) an open claim held were claimed again by another")
    seen = [
        f"while a claim held {len(held)} rows uncommitted, a second claim took {len(taken)} "
        "others without waiting"
    ]
    return problems, seen


def _seen_waiting(watcher: Connection, pid: int, done: threading.Event) -> bool:
    """Whether backend ``pid`` was seen waiting for a lock before ``done`` was set."""
    end = time.monotonic() + PATIENCE
    while not done.wait(0.005):
        with translate_errors("probe: watch the second claim"):
            row = watcher.execute(sql.statement("probe_claim_waiting"), {"pid": pid}).fetchone()
        if row is not None and row[0]:
            return True
        if time.monotonic() > end:
            return False
    return False


def _concurrent_claims(
    scratch: Scratch, texts: Statements, workers: int, rows: int
) -> tuple[list[str], list[str]]:
    """``workers`` threads claim and settle ``rows`` queued rows until none is left."""
    claims: list[_Claimed] = []
    refused: list[_Claimed] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(workers)

    def work(conn: Connection) -> None:
        try:
            start.wait(PATIENCE)
            while got := _claim(conn, texts, _CONCURRENT, CLAIM_BATCH):
                lost = [c for c in got if not _settle(conn, texts, c)]
                with lock:
                    claims.extend(got)
                    refused.extend(lost)
                    # a claim that hands out settled rows again never runs dry: stop it
                    if len(claims) >= 2 * rows:
                        return
        except Exception as exc:  # noqa: BLE001  (a worker's failure is evidence, reported)
            with lock:
                errors.append(str(exc) if isinstance(exc, FenceBridgeError) else type(exc).__name__)

    with ExitStack() as stack:
        connections = [stack.enter_context(scratch.connect()) for _ in range(workers)]
        threads = [
            threading.Thread(target=work, args=(c,), name=f"fencebridge-probe-{i}", daemon=True)
            for i, c in enumerate(connections)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    per_fence = Counter(claims)
    per_row = Counter((t, o) for t, o, _ in claims)
    twice = sum(1 for n in per_fence.values() if n > 1)
    again = sum(1 for n in per_row.values() if n > 1)
    never = rows - len(per_row)
    problems: list[str] = []
    if errors:
        problems.append(f"{len(errors)} worker(s) failed: {errors[0]}")
    if len(claims) >= 2 * rows:
        problems.append(f"the claims did not run out after {len(claims)} for {rows} rows")
    if twice:
        problems.append(f"{twice} row(s) claimed twice under one fence")
    if again:
        problems.append(f"{again} of {rows} row(s) claimed more than once")
    if never:
        problems.append(f"{never} of {rows} row(s) never claimed")
    if refused:
        problems.append(f"{len(refused)} settlement(s) refused under the fence just claimed")
    seen = [
        f"{workers} threads claimed {rows} rows: {twice} claimed twice, {len(claims)} claims "
        f"for {len(per_row)} rows, each settled under its fence"
    ]
    return problems, seen


# -- control 4: fenced writes -------------------------------------------------------------------


def _fence_evidence(scratch: Scratch, texts: Statements) -> Evidence:
    store = scratch.store(1)
    try:
        _queue(store, _FENCE, 1)
    finally:
        store.close()
    with scratch.connect() as stale, scratch.connect() as current:
        first = _claim(stale, texts, _FENCE, 1)
        if not first:
            return Evidence(False, "a claim of a queued row claimed nothing")
        with translate_errors("probe: end a lease"):
            stale.execute(sql.statement("probe_expire_lease"), {"job_type": _FENCE})
        second = _claim(current, texts, _FENCE, 1)
        if not second:
            return Evidence(False, "a row whose lease ended could not be taken over")
        old, new = first[0][2], second[0][2]
        stale_applied = _settle(stale, texts, first[0])
        current_applied = _settle(current, texts, second[0])
        with translate_errors("probe: read the row"):
            row = current.execute(sql.statement("probe_fence_row"), {"job_type": _FENCE})
            final = row.fetchone()
    problems: list[str] = []
    if final != ("succeeded", new):
        problems.append(f"the row ended as {final}, not succeeded under fence {new}")
    if new <= old:
        problems.append(f"the takeover did not advance the fence ({old} -> {new})")
    if stale_applied:
        problems.append(
            f"the stale worker's settlement under fence {old} applied after a takeover "
            f"(fence {new})"
        )
    if not current_applied:
        problems.append(f"the current worker's settlement under fence {new} was refused")
    return Evidence(
        not problems,
        "; ".join(problems)
        or (
            f"a takeover moved the fence {old} -> {new}; the stale settlement (fence {old}) "
            f"was refused, the current one (fence {new}) applied"
        ),
    )


# -- control 8: ack after commit ----------------------------------------------------------------


def _ack_evidence(
    scratch: Scratch, config: BridgeConfig, sub: SubscriptionConfig, lookup: AdapterLookup
) -> Evidence:
    label = f"{sub.name} ({sub.source})"
    found = lookup(sub.source)
    hook = found.probe_ack_after_commit
    if hook is None:
        return Evidence(False, f"{label}: adapter {sub.source} offers no probe")
    store = scratch.store(2)
    try:
        inbox = Inbox(
            store.inbox,
            partial(decode, config.decode_rules(sub.name)),
            system=found.messaging_system,
        )
        with scratch.connect() as conn:
            _execute(conn, "probe_commit_fails")
            try:
                failed = _driven(hook, sub, inbox)
            finally:
                _execute(conn, "probe_commit_works")
            kept = _written(conn, sub.name)
            committed = _driven(hook, sub, inbox)
            written = _written(conn, sub.name)
    finally:
        store.close()
    if isinstance(failed, str):
        return Evidence(False, f"{label}: the adapter's probe raised {failed}")
    if isinstance(committed, str):
        return Evidence(False, f"{label}: the adapter's probe raised {committed}")
    problems: list[str] = []
    if failed.acks:
        problems.append(f"{failed.call} x{failed.acks} although the inbox commit failed")
    if kept:
        problems.append("the commit the probe made fail was kept")
    if not committed.acks or not written:
        problems.append(
            f"after a commit that succeeded the stand-in recorded {failed.call} "
            f"x{committed.acks}: the probe did not drive the acknowledgement"
        )
    raised = f" ({failed.raised})" if failed.raised else ""
    return Evidence(
        not problems,
        f"{label}: "
        + (
            "; ".join(problems)
            or (
                f"inbox commit failed{raised} -> {failed.call} x0; commit succeeded -> "
                f"{committed.call} x{committed.acks} (stand-in broker)"
            )
        ),
    )


def _driven(
    hook: sources.AckProbe, sub: SubscriptionConfig, inbox: Inbox
) -> sources.ProbedAcks | str:
    """What the adapter's stand-in recorded, or the class of what its probe raised."""
    try:
        return hook(sub, inbox)
    except Exception as exc:  # noqa: BLE001  (an adapter's broken probe is evidence)
        return type(exc).__name__


def _written(conn: Connection, subscription: str) -> int:
    with translate_errors("probe: count what the inbox holds"):
        row = conn.execute(sql.statement("probe_written"), {"subscription": subscription})
        found = row.fetchone()
    return int(found[0]) if found else 0


# -- statements ---------------------------------------------------------------------------------


def _queue(store: PostgresStore, job_type: str, n: int) -> None:
    """``n`` queued rows of ``job_type`` in the scratch schema (through the real inbox insert)."""
    deliveries: Sequence[Delivery] = [
        Delivery(
            tenant_id=_TENANT,
            operation_id=f"{job_type}-{i}",
            subscription=_SUBSCRIPTION,
            job_type=job_type,
            target_class=TargetClass.A,
            payload=b"{}",
        )
        for i in range(n)
    ]
    for i in range(0, n, _INGEST_CHUNK):
        store.inbox.ingest(deliveries[i : i + _INGEST_CHUNK])


def _claim(conn: Connection, texts: Statements, job_type: str, limit: int) -> list[_Claimed]:
    params = {
        "worker": _WORKER,
        "limit": limit,
        "lease": _LEASE,
        "job_types": [job_type],
        "identity_keys": None,
        "history": _HISTORY,
        # no concurrency limit applies to the probe's job types
        "slots": None,
        "now": None,
    }
    with translate_errors("probe: claim"):
        rows = conn.execute(texts[CLAIM], params).fetchall()
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def _settle(conn: Connection, texts: Statements, claimed: _Claimed) -> bool:
    """Settle as succeeded under the claim's fence; False when the statement refused it."""
    tenant_id, operation_id, fence = claimed
    params = {
        "tenant_id": tenant_id,
        "operation_id": operation_id,
        "fence": fence,
        "state": "succeeded",
        "outcome_code": "probe",
        "outcome_detail": None,
        "error_class": None,
        "finding": None,
        "history": _HISTORY,
        "now": None,
    }
    with translate_errors("probe: settle"):
        row = conn.execute(texts[SETTLE], params).fetchone()
    return row is not None


def _execute(conn: Connection, name: str) -> None:
    with translate_errors(f"probe: {name}"):
        conn.execute(sql.statement(name))
