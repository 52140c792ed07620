"""``fencebridge check``: the nine go/no-go controls, evaluated per job type. All required.

Each control is one function of a job type's evidence (its configuration, its handler class,
the database catalog and the statements this fencebridge ships) and answers go or no-go with
the evidence it saw. There is no score: one no-go anywhere makes the whole answer no-go, for
that job type and for the check.

What a control cannot see is said in its evidence, not assumed. The check reads; it never
writes to the live schema and never calls a target. Controls 3 (atomic claim), 4 (fenced
writes) and 8 (ack after commit) need evidence that runs: with ``--probe``
(:mod:`bridge.operator.probe`) they take their verdict from a concurrency run, a stale-fence write
and a failed inbox commit driven through each adapter, executed in a scratch schema that is
dropped afterwards. Without it they answer from what they read, and say that they were
not probed. It builds every handler exactly as ``fencebridge run`` does
(:func:`bridge.executors.registry.build_job`, the one function both call), so a handler that cannot
be imported, built or registered fails its job type here, with the reason, instead of failing
the bridge at start; building a handler must therefore not act on its target. Beyond that a
handler is judged by its class (its base, and whether ``lookup`` has a body that can answer).
Passing does not certify a system; it means the known, avoidable ways to duplicate a side
effect are closed off.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final

from bridge import sql
from bridge.adapters import sources
from bridge.config import BridgeConfig, JobConfig, SubscriptionConfig
from bridge.database import Connection, translate_errors
from bridge.errors import ConfigError
from bridge.executors.registry import Registry, build_job
from bridge.handlers import (
    ConditionalWriteHandler,
    Handler,
    IdempotentApiHandler,
    SameDatabaseHandler,
    UnfencedHandler,
)
from bridge.ingest.decode import SourceKind
from bridge.operator.brokers import BrokerLook
from bridge.operator.probe import ProbeReport
from bridge.operator.retention import within_redelivery
from bridge.store.migrate import current_version
from bridge.types import TargetClass

_BASES: Final = (
    SameDatabaseHandler,
    ConditionalWriteHandler,
    IdempotentApiHandler,
    UnfencedHandler,
)
#: statements every fenced write is made of: each must carry the fence and the claimed state
_FENCED_STATEMENTS: Final = (
    "heartbeat",
    "heartbeat_many",
    "settle",
    "settle_many",
    "retry_later",
    "record_intent",
    "release",
    "lock_claim",
)
_FENCE_CONDITION: Final = re.compile(r"\bfence\s*=\s*(?:%\(fence\)s|t\.fence)")
_CLAIMED_CONDITION: Final = re.compile(r"\bstate\s*=\s*'claimed'")
_FENCE_BUMP: Final = re.compile(r"\bfence\s*=\s*w\.fence\s*\+\s*1")
_DATABASE_LEASE: Final = re.compile(
    r"lease_expires_at\s*=\s*coalesce\(%\(now\)s::timestamptz, now\(\)\)"
)
_STATES: Final = ("failed_terminal", "unknown", "quarantined")
#: what a control without its executed evidence says instead
_NOT_PROBED: Final = "not probed (`fencebridge check --probe` runs its evidence)"


@dataclass(frozen=True, slots=True)
class Control:
    number: int
    title: str


@dataclass(frozen=True, slots=True)
class Verdict:
    go: bool
    evidence: str
    #: False for a go that rests on what was read where evidence should have run (no probe)
    executed: bool = True
    #: settings found that hold but deserve a look (a queue without a dead-letter queue)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Finding:
    job_type: str
    control: Control
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Report:
    findings: tuple[Finding, ...]

    @property
    def go(self) -> bool:
        return bool(self.findings) and all(f.verdict.go for f in self.findings)

    @property
    def no_go(self) -> list[Finding]:
        return [f for f in self.findings if not f.verdict.go]

    @property
    def not_probed(self) -> list[Finding]:
        """Go answers whose evidence was read, not executed (``check`` without ``--probe``)."""
        return [f for f in self.findings if f.verdict.go and not f.verdict.executed]


# -- evidence ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseFacts:
    """The catalog facts the controls rest on (``store/check_catalog.sql``)."""

    schema_version: int
    wanted_version: int
    primary_key: tuple[str, ...]
    payload_hash_not_null: bool
    payload_hash_is_sha256: bool
    identity_immutable: bool
    claim_index_predicate: str | None
    fence_column: str | None
    state_check: str
    row_security: frozenset[str]
    work_item_without_body: bool
    payload_table: bool
    erasure_audit: bool
    erasure_function: bool

    @property
    def schema_problem(self) -> str | None:
        if self.schema_version == self.wanted_version:
            return None
        return (
            f"schema version {self.schema_version}, this fencebridge needs "
            f"{self.wanted_version} (run `fencebridge migrate`)"
        )


def read_database(conn: Connection) -> DatabaseFacts:
    """Read the catalog facts; an unmigrated database answers, it does not fail."""
    version = current_version(conn)
    with translate_errors("check"):
        row = conn.execute(sql.statement("check_catalog")).fetchone()
    assert row is not None
    (pk, hash_not_null, sha256, immutable, claim_index, fence, states, rls, no_body, payload,
     erasure_audit, erasure_function) = row  # fmt: skip
    return DatabaseFacts(
        schema_version=version,
        wanted_version=sql.migrations()[-1].version,
        primary_key=tuple(pk or ()),
        payload_hash_not_null=bool(hash_not_null),
        payload_hash_is_sha256=bool(sha256),
        identity_immutable=bool(immutable),
        claim_index_predicate=claim_index,
        fence_column=fence,
        state_check=states or "",
        row_security=frozenset(rls or ()),
        work_item_without_body=bool(no_body),
        payload_table=bool(payload),
        erasure_audit=bool(erasure_audit),
        erasure_function=bool(erasure_function),
    )


@dataclass(frozen=True, slots=True)
class HandlerFacts:
    """A job type's handler: its class, and why ``run`` could not start it, if it could not."""

    path: str
    cls: type[Handler] | None
    #: why building or registering the handler failed, as ``run`` would report it
    problem: str | None = None

    @property
    def name(self) -> str:
        return self.cls.__name__ if self.cls is not None else self.path

    @property
    def target_class(self) -> TargetClass | None:
        if self.cls is None:
            return None
        return next((b.target_class for b in _BASES if issubclass(self.cls, b)), None)


def build_handler(config: BridgeConfig, job_type: str, registry: Registry) -> HandlerFacts:
    """Build and register the job type's handler as ``run`` does; a failure is evidence."""
    path = config.jobs[job_type].handler
    try:
        spec = build_job(config, job_type, registry)
    except ConfigError as exc:
        return HandlerFacts(path, _handler_class(path), str(exc))
    return HandlerFacts(path, type(spec.handler))


def _handler_class(path: str) -> type[Handler] | None:
    """The handler class the path names, when a build failed: for the other controls."""
    module_name, _, attribute = path.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except Exception:  # noqa: BLE001  (the build failure already says why)
        return None
    cls = target if isinstance(target, type) else type(target)
    return cls if issubclass(cls, _BASES) else None


def lookup_problem(cls: type[IdempotentApiHandler]) -> str | None:
    """Why a class C handler's ``lookup`` cannot answer, or None if it has a real body."""
    if "lookup" in getattr(cls, "__abstractmethods__", ()):
        return f"{cls.__name__}.lookup is abstract (not implemented)"
    function = getattr(cls, "lookup", None)
    if function is None or function is IdempotentApiHandler.lookup:
        return f"{cls.__name__} does not implement lookup"
    if _placeholder(function):
        return f"{cls.__name__}.lookup only raises NotImplementedError (or does nothing)"
    return None


def _placeholder(function: Callable[..., Any]) -> bool:
    """A body that cannot answer: only a docstring, ``pass``, ``...`` or NotImplementedError."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False  # no source to read: the override is taken at its word
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    body = [
        s
        for s in node.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        and not isinstance(s, ast.Pass)
    ]
    if not body:
        return True
    if len(body) == 1 and isinstance(body[0], ast.Raise):
        raised = body[0].exc
        if isinstance(raised, ast.Call):
            raised = raised.func
        return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
    return False


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """Everything the controls may look at for one job type."""

    job: JobConfig
    handler: HandlerFacts
    subscriptions: tuple[SubscriptionConfig, ...]
    config: BridgeConfig
    db: DatabaseFacts
    #: installed broker adapters (entry points of ``fencebridge.sources``)
    sources: frozenset[str]
    #: the executed evidence of controls 3, 4 and 8 (``--probe``), or None: not run
    probe: ProbeReport | None = None
    #: what each subscription's broker said of its queue or subscription, or None: not asked
    brokers: Mapping[str, BrokerLook] | None = None


# -- the nine controls ------------------------------------------------------------------------


def identity(e: JobEvidence) -> Verdict:
    """1. Operation identity is durable and tenant-scoped."""
    problems, seen = [], []
    if e.db.schema_problem:
        problems.append(e.db.schema_problem)
    pk = e.db.primary_key
    if pk[:1] != ("tenant_id",) or "operation_id" not in pk:
        problems.append(f"work_item primary key is ({', '.join(pk) or 'missing'})")
    else:
        seen.append(f"primary key ({', '.join(pk)})")
    for sub in e.subscriptions:
        decode = sub.decode
        if decode.operation_id.kind is SourceKind.MESSAGE_ID:
            problems.append(
                f"{sub.name} takes operation_id from the broker's message id: a producer's "
                "resend becomes a second operation"
            )
        else:
            seen.append(f"{sub.name}: tenant {decode.tenant_id}, operation {decode.operation_id}")
    return _verdict(problems, seen)


def payload_binding(e: JobEvidence) -> Verdict:
    """2. Identity is bound to an immutable payload hash; a changed payload is rejected."""
    problems, seen = [], []
    if e.db.schema_problem:
        problems.append(e.db.schema_problem)
    if not (e.db.payload_hash_not_null and e.db.payload_hash_is_sha256):
        problems.append("work_item.payload_hash is not a required sha256")
    else:
        seen.append("payload_hash NOT NULL, 32 bytes (sha256)")
    if not e.db.identity_immutable:
        problems.append("the identity-immutability trigger is missing or disabled")
    else:
        seen.append("identity and hash immutable (trigger)")
    seen.append("same key + other hash = recorded conflict, nothing mutated")
    seen.extend(f"{sub.name} hashes {sub.decode.payload}" for sub in e.subscriptions)
    return _verdict(problems, seen)


def atomic_claim(e: JobEvidence) -> Verdict:
    """3. A claim is atomic across concurrent workers."""
    problems, seen = [], []
    for name in ("claim", "claim_limited", "claim_keys", "claim_keys_limited"):
        text = sql.statement(name)
        if "SKIP LOCKED" not in text or not _FENCE_BUMP.search(text):
            problems.append(f"store/{name}.sql does not lock, skip and bump the fence at once")
        elif not _DATABASE_LEASE.search(text):
            problems.append(f"store/{name}.sql does not take the lease from the database clock")
    if not problems:
        seen.append("one statement: FOR UPDATE SKIP LOCKED, fence + 1, lease from now()")
    if e.db.claim_index_predicate is None:
        problems.append(e.db.schema_problem or "the claim index work_item_due is missing")
    else:
        seen.append(f"claim index work_item_due WHERE {e.db.claim_index_predicate}")
    if e.probe is None:
        return _unprobed(problems, seen)
    (problems if not e.probe.claim.go else seen).insert(0, f"probe: {e.probe.claim.ran}")
    return _verdict(problems, seen)


def fenced_writes(e: JobEvidence) -> Verdict:
    """4. Every state change is a conditional mutation on the fence, inside the write."""
    problems, seen = [], []
    if e.db.fence_column != "bigint NOT NULL":
        problems.append(e.db.schema_problem or f"work_item.fence is {e.db.fence_column}")
    unfenced = [
        n
        for n in _FENCED_STATEMENTS
        if not (
            _FENCE_CONDITION.search(sql.statement(n))
            and _CLAIMED_CONDITION.search(sql.statement(n))
        )
    ]
    if unfenced:
        problems.append(f"not conditional on fence and state: {', '.join(unfenced)}")
    else:
        seen.append(f"{len(_FENCED_STATEMENTS)} writes carry fence = :fence AND state = 'claimed'")
    match e.handler.target_class:
        case TargetClass.A:
            seen.append("business write in the transaction that locks the row under its fence")
        case TargetClass.B:
            seen.append("the target store's condition carries the fence")
        case TargetClass.C | TargetClass.D:
            seen.append("the target cannot check a fence: limits stated under control 5")
        case None:
            pass
    if e.probe is None:
        return _unprobed(problems, seen)
    (problems if not e.probe.fence.go else seen).insert(0, f"probe: {e.probe.fence.ran}")
    return _verdict(problems, seen)


def target_class(e: JobEvidence) -> Verdict:
    """5. The target enforces the fence, or the job is classed C or D with its stated limits."""
    declared = e.job.target_class
    actual = e.handler.target_class
    if e.handler.cls is not None and actual is not None and actual is not declared:
        return Verdict(
            False,
            f"declared class {declared.value}, but {e.handler.name} is a class "
            f"{actual.value} handler ({_base(e.handler.cls)})",
        )
    if e.handler.problem:
        return Verdict(False, f"`fencebridge run` cannot start it: {e.handler.problem}")
    assert e.handler.cls is not None
    return Verdict(
        True,
        f"class {declared.value} declared; {e.handler.name} extends {_base(e.handler.cls)}; "
        f"claim: {e.handler.cls.guarantee}",
    )


def ambiguous_outcomes(e: JobEvidence) -> Verdict:
    """6. Ambiguous outcomes go to reconciliation or unknown, never to a blind retry."""
    cls, actual = e.handler.cls, e.handler.target_class
    if cls is None or actual is None:
        return Verdict(False, f"no handler class to judge: {e.handler.problem}")
    problems, seen = [], []
    if "'unknown'" not in e.db.state_check:
        problems.append(e.db.schema_problem or "work_item has no 'unknown' state")
    match actual:
        case TargetClass.A:
            seen.append("an ambiguous outcome rolls the transaction back: retried, nothing applied")
        case TargetClass.B:
            seen.append(
                "ambiguous: retried under the next fence, which supersedes it; "
                "on the last attempt: unknown"
            )
        case TargetClass.C:
            assert issubclass(cls, IdempotentApiHandler)
            problem = lookup_problem(cls)
            if problem:
                problems.append(f"{problem}: an ambiguous attempt could not be reconciled")
            else:
                seen.append(
                    f"{cls.__name__}.lookup by idempotency key before any retry: applied -> "
                    "succeeded, not applied -> retry, cannot tell -> unknown"
                )
        case TargetClass.D:
            if e.job.max_attempts != 1:
                problems.append(
                    f"class D handler {cls.__name__} with max_attempts = {e.job.max_attempts}: "
                    "a second attempt could repeat a call that may have happened"
                )
            else:
                seen.append(
                    "max_attempts = 1; intent recorded before the call; ambiguous -> unknown"
                )
    return _verdict(problems, seen)


def terminal_states(e: JobEvidence) -> Verdict:
    """7. Terminal failure and quarantine exist, with bounded attempts and a named owner."""
    problems, seen = [], []
    missing = [s for s in _STATES if f"'{s}'" not in e.db.state_check]
    if missing:
        problems.append(e.db.schema_problem or f"work_item lacks states {', '.join(missing)}")
    else:
        seen.append("states failed_terminal, unknown, quarantined")
    seen.append(
        f"max_attempts = {e.job.max_attempts}: exhausted retry -> failed_terminal, "
        "expired last attempt -> unknown"
    )
    if e.job.owner is None:
        problems.append(f"no owner: set jobs.{e.job.name}.owner (who answers for parked rows)")
    else:
        seen.append(f"owner {e.job.owner}")
    return _verdict(problems, seen)


def ack_after_commit(e: JobEvidence) -> Verdict:
    """8. The broker is acknowledged only after the durable work row commits."""
    if not e.subscriptions:
        return Verdict(True, "no subscription delivers this job type")
    problems: list[str] = []
    seen: list[str] = []
    warnings: list[str] = []
    unasked = _brokers(e, problems, seen, warnings)
    for sub in e.subscriptions:
        if sub.source not in e.sources:
            problems.append(f"{sub.name}: no consumer installed for source {sub.source}")
        elif e.probe is None:
            seen.append(f"{sub.name} ({sub.source}, {sub.ack_mode.value}): consumer installed")
        else:
            probed = e.probe.acks.get(sub.name)
            if probed is None:
                problems.append(f"{sub.name}: the probe did not run it")
            else:
                (seen if probed.go else problems).append(f"probe: {probed.ran}")
    seen.extend(f"warning: {w}" for w in warnings)
    executed = e.probe is not None and not unasked
    verdict = _verdict(problems, seen) if executed else _unprobed(problems, seen)
    return replace(verdict, warnings=tuple(warnings)) if verdict.go else verdict


def _brokers(e: JobEvidence, problems: list[str], seen: list[str], warnings: list[str]) -> bool:
    """What the brokers said of each subscription's queue or subscription, sorted into the
    lists; True when one of them was not asked (the control is then not probed)."""
    unasked = e.brokers is None
    for sub in e.subscriptions:
        look = e.brokers.get(sub.name) if e.brokers is not None else None
        if look is None:
            continue
        if look.not_probed is not None:
            unasked = True
            seen.append(f"{sub.name}: broker not probed ({look.not_probed})")
            continue
        for found in look.findings:
            if not found.go:
                problems.append(f"{sub.name}: {found.text}")
            else:
                (warnings if found.warning else seen).append(f"{sub.name}: {found.text}")
    return unasked


def retention(e: JobEvidence) -> Verdict:
    """9. Identifiers and payloads follow a retention and deletion plan with an owner."""
    problems, seen = [], []
    db = e.db
    if db.schema_problem:
        problems.append(db.schema_problem)
    if not (db.payload_table and db.work_item_without_body):
        problems.append("payloads are not kept apart from work rows")
    else:
        seen.append("payloads by reference (payload table)")
    if not (db.erasure_function and db.erasure_audit):
        problems.append("no audited erasure that keeps tombstones in the schema")
    else:
        seen.append("erase --tenant/--operation audited by keyed hashes, tombstones kept")
    plan = e.config.retention
    if plan is None:
        problems.append("no [retention] table: purge age and erasure owner unset")
        return _verdict(problems, seen)
    problems.extend(
        within_redelivery(
            timedelta(days=plan.purge_after_days),
            timedelta(days=plan.tombstone_days),
            ((sub.name, sub.source) for sub in e.subscriptions),
        )
    )
    seen.append(
        f"purge after {plan.purge_after_days} d; tombstones kept {plan.tombstone_days} d; "
        f"erasure owner {plan.erasure_owner}"
    )
    return _verdict(problems, seen)


CHECKS: Final[tuple[tuple[Control, Callable[[JobEvidence], Verdict]], ...]] = (
    (Control(1, "identity durable, tenant-scoped"), identity),
    (Control(2, "payload hash bound"), payload_binding),
    (Control(3, "atomic claim"), atomic_claim),
    (Control(4, "fenced writes"), fenced_writes),
    (Control(5, "target class and honest claim"), target_class),
    (Control(6, "ambiguous -> reconcile or unknown"), ambiguous_outcomes),
    (Control(7, "bounded attempts, owner"), terminal_states),
    (Control(8, "ack after commit"), ack_after_commit),
    (Control(9, "retention and erasure"), retention),
)


def evaluate(
    config: BridgeConfig,
    db: DatabaseFacts,
    probe: ProbeReport | None = None,
    *,
    job_types: Sequence[str] | None = None,
    brokers: Mapping[str, BrokerLook] | None = None,
) -> Report:
    """Every control for every job type of the configuration (or those of ``job_types``: the
    gate of one job type's cut-over from shadow to live); controls 3, 4 and 8 from the probe's
    executed evidence when there is one."""
    installed = frozenset(sources.names())
    findings: list[Finding] = []
    registry = Registry()
    for name, job in sorted(config.jobs.items()):
        if job_types is not None and name not in job_types:
            continue
        evidence = JobEvidence(
            job=job,
            handler=build_handler(config, name, registry),
            subscriptions=tuple(s for s in config.subscriptions.values() if name in s.job_types),
            config=config,
            db=db,
            sources=installed,
            probe=probe,
            brokers=brokers,
        )
        findings.extend(Finding(name, control, check(evidence)) for control, check in CHECKS)
    return Report(tuple(findings))


def _verdict(problems: Sequence[str], seen: Sequence[str]) -> Verdict:
    if problems:
        return Verdict(False, "; ".join(problems))
    return Verdict(True, "; ".join(seen))


def _unprobed(problems: Sequence[str], seen: Sequence[str]) -> Verdict:
    """A control whose evidence must run, decided from what was read: a go says so."""
    if problems:
        return Verdict(False, "; ".join(problems))
    return Verdict(True, "; ".join([*seen, _NOT_PROBED]), executed=False)


def _base(cls: type[Handler]) -> str:
    return next(b.__name__ for b in _BASES if issubclass(cls, b))
