"""Redrive: parked work sent back to the queue, reconciling first.

Redriving is itself a consequential action. It keeps each operation's identity, and it never
sends back to the queue a row whose effect may already have happened unless the next attempt
is safe:

==========================  ======================================================================
parked row                  what a redrive does
==========================  ======================================================================
unknown, class C            the handler's ``lookup`` by the operation's idempotency key first:
                            applied → ``succeeded``; not applied → ``queued``; cannot tell → stays
unknown, class D            no intent recorded → ``queued`` (the target was never called);
                            intent recorded → stays, unless the target's owner confirmed the call
                            did not happen (``confirm_not_called``): ``queued``, intent cleared
unknown, class A or B       ``queued``: the fence (A: one transaction, B: the store's condition)
                            refuses whatever the lost attempt tries later
quarantined                 ``queued``
quarantined delivery        decoded again with the current rules: a delivery goes to the inbox
                            (new, replay or conflict) and the record is closed; still
                            undecodable → stays
==========================  ======================================================================

Rows sent back keep their attempt count, so the next claim has ``attempts > 1`` and reconciles
again before acting. Every move is one guarded, audited statement; a dry run runs the same
statements in transactions that are rolled back (lookups, which only read, still happen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bridge.config import BridgeConfig
from bridge.errors import ConfigError
from bridge.executors.intent import call_may_have_left
from bridge.executors.registry import load_handler
from bridge.handlers import (
    Applied,
    Context,
    Handler,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
)
from bridge.identity import IdentityHasher
from bridge.ingest.decode import DecodeRules, SourceKind, decode
from bridge.store.postgres import PostgresStore
from bridge.store.records import (
    ParkedRow,
    QuarantinedDelivery,
)
from bridge.types import Decision, Delivery, Key, RawDelivery, RedriveFilter, State, TargetClass


@dataclass(frozen=True, slots=True)
class RowResult:
    """What a redrive did (or, on a dry run, would do) with one parked row."""

    row: ParkedRow
    #: the state the row took; None when it stays parked or was moved by someone else
    to: State | None
    note: str


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What a redrive did with one quarantined delivery."""

    delivery: QuarantinedDelivery
    #: new, replay or conflict once in the inbox; quarantined if it still cannot be decoded;
    #: None when it could not be tried or another redrive closed it first
    decision: Decision | None
    key: Key | None
    note: str


@dataclass
class RedriveReport:
    dry_run: bool
    rows: list[RowResult] = field(default_factory=list)
    deliveries: list[DeliveryResult] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return sum(r.to is not None for r in self.rows) + sum(
            d.decision in (Decision.NEW, Decision.REPLAY, Decision.CONFLICT)
            for d in self.deliveries
        )

    @property
    def left(self) -> int:
        return len(self.rows) + len(self.deliveries) - self.moved


class Redrive:
    """One operator's redrive: who, why, and how far it may go."""

    def __init__(
        self,
        store: PostgresStore,
        config: BridgeConfig,
        hasher: IdentityHasher,
        *,
        actor: str,
        reason: str,
        dry_run: bool = False,
        extra_attempts: int = 1,
        confirm_not_called: bool = False,
        handlers: Mapping[str, Handler] | None = None,
    ) -> None:
        if not actor or not reason:
            raise ValueError("a redrive needs an actor and a reason for the audit record")
        self._store = store
        self._config = config
        self._hasher = hasher
        self._actor = actor
        self._reason = reason
        self._dry_run = dry_run
        self._extra_attempts = extra_attempts
        self._confirm_not_called = confirm_not_called
        self._handlers: dict[str, Handler | str] = dict(handlers or {})

    def run(self, selection: RedriveFilter, *, deliveries: bool) -> RedriveReport:
        """Redrive the parked rows the selection names, then (if asked) the quarantined
        deliveries it names."""
        report = RedriveReport(self._dry_run)
        to_queue: dict[State, list[ParkedRow]] = {}
        for row in self._store.operator.parked(selection):
            result = self._decide(row)
            if result is None:
                to_queue.setdefault(row.state, []).append(row)
            else:
                report.rows.append(result)
        for state, rows in to_queue.items():
            report.rows.extend(self._queue(state, rows))
        if deliveries:
            for delivery in self._store.operator.quarantined_deliveries(selection):
                report.deliveries.append(self._redecode(delivery))
        return report

    # -- parked rows ---------------------------------------------------------------------------

    def _decide(self, row: ParkedRow) -> RowResult | None:
        """None: send back to the queue; otherwise the result of handling it here."""
        if row.state is State.QUARANTINED:
            return None
        if row.target_class is TargetClass.C:
            return self._reconcile(row)
        if row.target_class is TargetClass.D:
            return self._unfenced(row)
        return None

    def _reconcile(self, row: ParkedRow) -> RowResult | None:
        found = self._lookup(row)
        if isinstance(found, str):
            return RowResult(row, None, found)
        if isinstance(found, NotApplied):
            return None
        moved = self._store.operator.redrive_applied(
            row,
            outcome_code=found.code,
            outcome_detail=found.detail,
            actor=self._actor,
            reason=self._reason,
            dry_run=self._dry_run,
        )
        if not moved:
            return RowResult(row, None, "lookup: applied, but the row moved on meanwhile")
        return RowResult(row, State.SUCCEEDED, "lookup: applied")

    def _lookup(self, row: ParkedRow) -> Applied | NotApplied | str:
        """Ask the handler's lookup, by the operation's idempotency key; a string says why
        there is no answer."""
        handler = self._handler(row.job_type)
        if isinstance(handler, str):
            return f"cannot look up: {handler}"
        if not isinstance(handler, IdempotentApiHandler):
            return "cannot look up: the job type's handler is not a class C handler"
        if row.payload is None:
            return "cannot look up: the payload is gone"
        ctx = Context.for_claim(row, self._hasher)
        try:
            found = handler.lookup(ctx, ctx.idempotency_key)
        except Quarantine as exc:
            return (
                f"the lookup cannot read the payload ({exc}): stays unknown, for a person to "
                "compare with the provider's record"
            )
        except Exception as exc:  # noqa: BLE001  (a lookup that fails cannot tell)
            return f"lookup cannot tell ({type(exc).__name__}): stays unknown"
        return (
            found
            if isinstance(found, Applied | NotApplied)
            else "lookup gave no answer: stays unknown"
        )

    def _unfenced(self, row: ParkedRow) -> RowResult | None:
        if not call_may_have_left(row.intent_fence):
            return None  # the intent is recorded before any call: none was made
        if not self._confirm_not_called:
            return RowResult(
                row,
                None,
                f"class D intent recorded at fence {row.intent_fence}: the call may have "
                "happened; stays until its owner confirms it did not",
            )
        moved = self._store.operator.redrive_unfenced(
            row,
            actor=self._actor,
            reason=f"{self._reason} [confirmed not called; intent at fence {row.intent_fence} "
            "cleared]",
            extra_attempts=self._extra_attempts,
            dry_run=self._dry_run,
        )
        if not moved:
            return RowResult(row, None, "the row moved on meanwhile")
        return RowResult(row, State.QUEUED, "confirmed not called: intent cleared")

    def _queue(self, state: State, rows: list[ParkedRow]) -> list[RowResult]:
        moved = {
            r.key
            for r in self._store.operator.redrive(
                RedriveFilter(
                    states=(state,),
                    keys=tuple(r.key for r in rows),
                    fences=tuple(r.fence for r in rows),
                    limit=len(rows),
                ),
                actor=self._actor,
                reason=self._reason,
                extra_attempts=self._extra_attempts,
                dry_run=self._dry_run,
            )
        }
        return [
            RowResult(r, State.QUEUED, _why_queued(r))
            if r.key in moved
            else RowResult(r, None, "the row moved on meanwhile")
            for r in rows
        ]

    def _handler(self, job_type: str) -> Handler | str:
        """The job type's handler, or why there is none (imported once per redrive)."""
        if job_type not in self._handlers:
            job = self._config.jobs.get(job_type)
            if job is None:
                self._handlers[job_type] = "the job type is not in the configuration"
            else:
                try:
                    self._handlers[job_type] = load_handler(job.handler, job_type=job_type)
                except Exception as exc:  # noqa: BLE001  (its rows stay; the redrive goes on)
                    why = exc if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                    self._handlers[job_type] = f"the handler cannot be loaded ({why})"
        return self._handlers[job_type]

    # -- quarantined deliveries ----------------------------------------------------------------

    def _redecode(self, quarantined: QuarantinedDelivery) -> DeliveryResult:
        if quarantined.subscription not in self._config.subscriptions:
            return DeliveryResult(
                quarantined, None, None, "the subscription is not in the configuration"
            )
        if quarantined.body is None:
            return DeliveryResult(quarantined, None, None, "the raw body was not kept")
        rules = self._config.decode_rules(quarantined.subscription)
        decoded = decode(rules, _raw(rules, quarantined))
        if not isinstance(decoded, Delivery):
            return DeliveryResult(quarantined, Decision.QUARANTINED, None, decoded.reason)
        if self._dry_run:
            return DeliveryResult(quarantined, self._predict(decoded), decoded.key, "decoded")
        (result,) = self._store.inbox.ingest([decoded])
        closed = self._store.operator.close_rejected(
            quarantined.id, outcome=result.decision, actor=self._actor, reason=self._reason
        )
        if not closed:
            return DeliveryResult(quarantined, None, decoded.key, "another redrive closed it first")
        return DeliveryResult(quarantined, result.decision, decoded.key, "decoded")

    def _predict(self, delivery: Delivery) -> Decision:
        row = self._store.operator.history(delivery.key).row
        if row is None:
            return Decision.NEW
        return Decision.REPLAY if row.payload_hash == delivery.payload_hash else Decision.CONFLICT


def _why_queued(row: ParkedRow) -> str:
    if row.state is State.QUARANTINED:
        return "quarantined: back to the queue"
    if row.target_class is TargetClass.C:
        return "lookup: not applied"
    if row.target_class is TargetClass.D:
        return "no intent recorded: the target was never called"
    return f"class {row.target_class.value}: the fence refuses the lost attempt"


def _raw(rules: DecodeRules, quarantined: QuarantinedDelivery) -> RawDelivery:
    """The delivery as the inbox saw it, as far as it was kept.

    Broker attributes are not stored with a rejection; the identity fields that were read from
    attributes (and recorded because they were valid) are put back under the names the current
    rules read them from. Anything else an attribute carried is gone, so a rule that needs it
    quarantines the delivery again, with the reason.
    """
    attributes: dict[str, str] = {}
    for source, value in (
        (rules.tenant_id, quarantined.tenant_id),
        (rules.operation_id, quarantined.operation_id),
        (rules.job_type, quarantined.job_type),
    ):
        if source.kind is SourceKind.ATTRIBUTE and value is not None:
            attributes[source.argument] = value
    return RawDelivery(
        subscription=quarantined.subscription,
        message_id=quarantined.broker_message_id,
        body=quarantined.body or b"",
        attributes=attributes,
    )
