"""Spans, metrics and decision logs for the inbox and the worker tier.

:class:`Telemetry` is handed to the inbox (receive and inbox-write spans, dedupe decisions) and
to the worker pool (a process span per claim, plus :class:`~bridge.events.WorkEvents` for
every decision a run makes). It uses the global OpenTelemetry providers unless given its own,
so with nothing configured every call is a cheap no-op.

Nothing raw leaves through here: tenants and operations are keyed hashes, labels carry only
subscription, job type, decision, outcome and finding names, and payloads are never read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Protocol

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from bridge.identity import IdentityHasher
from bridge.service import Supervised
from bridge.telemetry import names as n
from bridge.telemetry.propagation import link_to
from bridge.types import Claim, Decision, Delivery, IngestResult, Rejection, State, Stats

if TYPE_CHECKING:
    from bridge.store.work import ConcurrencyLimit, TokenRate, WaitingCount
    from bridge.types import RawDelivery
    from bridge.types import Stats as _Stats

log = logging.getLogger(__name__)


class GaugeSource(Protocol):
    """**Protocol**: what the database gauges read (the bridge's store offers both)."""

    def open_stats(self) -> _Stats: ...

    def waiting(
        self,
        limits: Mapping[str, ConcurrencyLimit] | None = None,
        rates: Mapping[str, TokenRate] | None = None,
    ) -> list[WaitingCount]: ...


class OutboxBacklog(Protocol):
    """**Protocol**: one outbox destination's backlog (:class:`bridge.outbox.relay.OutboxDepth`)."""

    @property
    def destination(self) -> str: ...
    @property
    def pending(self) -> int: ...
    @property
    def oldest_pending_seconds(self) -> float | None: ...
    @property
    def parked(self) -> int: ...


decisions_log = logging.getLogger("fencebridge.decisions")


class Decided(Protocol):
    """A delivery the inbox has written and decided on (:class:`bridge.ingest.inbox.Written`).

    Declared here, not imported, so that telemetry does not depend on the inbox it observes.
    """

    @property
    def raw(self) -> RawDelivery: ...

    @property
    def decoded(self) -> Delivery | Rejection: ...

    @property
    def result(self) -> IngestResult: ...

    @property
    def decision(self) -> Decision: ...


STATS_REFRESH_SECONDS_DEFAULT = 15.0
#: bucket bounds for the duration histograms, in seconds (the SDK's default bounds are meant
#: for milliseconds and would put every inbox commit in the first bucket)
DURATION_BUCKETS_SECONDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)


def _failed(span: trace.Span, error_type: str, description: str) -> None:
    """Mark a run that did not succeed as the semantic conventions ask: status and error.type.

    ``error_type`` is an outcome code or a fixed word, never error text (which may quote a
    payload).
    """
    span.set_status(trace.Status(trace.StatusCode.ERROR, description))
    span.set_attribute(n.ERROR_TYPE, error_type)


class Telemetry:
    """One per process; thread-safe."""

    def __init__(
        self,
        hasher: IdentityHasher,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._hasher = hasher
        self._tracer = trace.get_tracer(
            n.INSTRUMENTATION_NAME, tracer_provider=tracer_provider, schema_url=n.SCHEMA_URL
        )
        meter = metrics.get_meter(n.INSTRUMENTATION_NAME, meter_provider=meter_provider)
        self._deliveries = meter.create_counter(
            n.METRIC_DELIVERIES, unit="{delivery}", description="Deliveries by inbox decision"
        )
        self._completions = meter.create_counter(
            n.METRIC_COMPLETIONS, unit="{operation}", description="Settlements by outcome state"
        )
        self._takeovers = meter.create_counter(
            n.METRIC_TAKEOVERS, unit="{claim}", description="Claims of an expired lease"
        )
        self._lease_lost = meter.create_counter(
            n.METRIC_LEASE_LOST, unit="{claim}", description="Writes refused: fence not current"
        )
        self._fenced_out = meter.create_counter(
            n.METRIC_FENCED_OUT, unit="{write}", description="Target writes refused by the fence"
        )
        self._reconciliations = meter.create_counter(
            n.METRIC_RECONCILIATIONS, unit="{lookup}", description="Lookups before acting"
        )
        self._rate_wait_clamped = meter.create_counter(
            n.METRIC_RATE_WAIT_CLAMPED,
            unit="{wait}",
            description="Rate limit waits cut to the job type's maximum",
        )
        self._commit = meter.create_histogram(
            n.METRIC_INBOX_COMMIT,
            unit="s",
            description="Inbox transaction, decode to COMMIT",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self._receive_to_ack = meter.create_histogram(
            n.METRIC_RECEIVE_TO_ACK,
            unit="s",
            description="Broker receive to acknowledgement",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self._claim_to_settle = meter.create_histogram(
            n.METRIC_CLAIM_TO_SETTLE,
            unit="s",
            description="Claim to settlement of one run",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self._restarts = meter.create_counter(
            n.METRIC_THREAD_RESTARTS,
            unit="{restart}",
            description="Supervised loops restarted after a failure, by service",
        )
        #: the supervised thread that refreshes the gauges, once :meth:`observe` started it
        self.gauges: Supervised | None = None
        self._meter = meter
        self._streams: dict[str, Callable[[], Mapping[str, int]]] = {}
        self._streams_lock = threading.Lock()
        meter.create_observable_counter(
            n.METRIC_STREAM_EVENTS,
            [self._observe_streams],
            unit="{event}",
            description="What happened on a broker stream: acks, extensions, lost broker leases",
        )
        self._stats: Stats | None = None
        self._waiting: list[WaitingCount] = []
        #: destination -> (pending, oldest pending age, parked); None until read or when stale
        self._outbox: dict[str, tuple[int, float, int]] | None = None
        #: subscriptions the queue depth reports, 0 when none of their rows is queued: the
        #: configured ones and every one seen with open or parked rows since observing began
        self._subscriptions: set[str] = set()
        self._stats_lock = threading.Lock()
        self._observing: threading.Event | None = None

    # -- inbox -------------------------------------------------------------------------------------

    @contextmanager
    def receive(
        self, system: str, subscription: str, batch: Sequence[RawDelivery]
    ) -> Iterator[trace.Span]:
        """The consumer span of one received batch, linked to each producer's span."""
        links = [link for raw in batch if (link := link_to(raw.trace_context)) is not None]
        with self._tracer.start_as_current_span(
            n.SPAN_RECEIVE.format(subscription=subscription),
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                n.MESSAGING_SYSTEM: system,
                n.MESSAGING_OPERATION_TYPE: "receive",
                n.MESSAGING_OPERATION_NAME: "receive",
                n.MESSAGING_SUBSCRIPTION: subscription,
                n.MESSAGING_BATCH_COUNT: len(batch),
            },
        ) as span:
            yield span

    @contextmanager
    def inbox_write(self, subscription: str) -> Iterator[trace.Span]:
        started = time.perf_counter()
        with self._tracer.start_as_current_span(
            n.SPAN_INBOX_WRITE.format(subscription=subscription),
            attributes={n.DB_SYSTEM: "postgresql", n.MESSAGING_SUBSCRIPTION: subscription},
        ) as span:
            yield span
        self._commit.record(time.perf_counter() - started, {n.LABEL_SUBSCRIPTION: subscription})

    def decided(self, span: trace.Span, written: Iterable[Decided]) -> None:
        """One span event, one count and (when it needs a person) one log line per delivery."""
        recording = span.is_recording()
        for w in written:
            subscription = w.raw.subscription
            self._deliveries.add(
                1, {n.LABEL_SUBSCRIPTION: subscription, n.LABEL_DECISION: w.decision.value}
            )
            needs_person = w.decision in (Decision.CONFLICT, Decision.QUARANTINED)
            if not (recording or needs_person):
                continue
            attributes: dict[str, str] = {n.DECISION: w.decision.value}
            operation_id = w.result.key.operation_id if w.result.key is not None else None
            if w.raw.message_id and w.raw.message_id != operation_id:
                # A subscription may take its operation ids from the broker's message ids:
                # then the message id is a raw identifier and stays out.
                attributes[n.MESSAGING_MESSAGE_ID] = w.raw.message_id
            if w.result.key is not None:
                attributes[n.TENANT_HASH] = self._hasher.tenant(w.result.key.tenant_id)
                attributes[n.OPERATION_HASH] = self._hasher.operation(
                    w.result.key.tenant_id, w.result.key.operation_id
                )
            reason = getattr(w.decoded, "reason", None)
            if w.decision is Decision.QUARANTINED and reason:
                attributes[n.REASON] = reason.split(":", 1)[0]
            if recording:
                span.add_event(n.EVENT_DECISION, attributes)
            if needs_person:
                decisions_log.warning(
                    "%s delivery recorded for the producer team",
                    w.decision.value,
                    extra={"fencebridge": {n.MESSAGING_SUBSCRIPTION: subscription, **attributes}},
                )

    @contextmanager
    def ack(self, system: str, subscription: str, count: int) -> Iterator[trace.Span]:
        """The span of one acknowledging call to the broker (the broker's call is its child)."""
        with self._tracer.start_as_current_span(
            n.SPAN_ACK.format(subscription=subscription),
            kind=trace.SpanKind.CLIENT,
            attributes={
                n.MESSAGING_SYSTEM: system,
                n.MESSAGING_OPERATION_TYPE: "settle",
                n.MESSAGING_OPERATION_NAME: "ack",
                n.MESSAGING_SUBSCRIPTION: subscription,
                n.MESSAGING_BATCH_COUNT: count,
            },
        ) as span:
            yield span

    def acked(self, subscription: str, seconds: float) -> None:
        """A consumer acknowledged a delivery ``seconds`` after receiving it."""
        self._receive_to_ack.record(seconds, {n.LABEL_SUBSCRIPTION: subscription})

    # -- worker tier -------------------------------------------------------------------------------

    def _claim_attributes(self, claim: Claim) -> dict[str, str | int | bool]:
        attributes: dict[str, str | int | bool] = {
            n.MESSAGING_OPERATION_TYPE: "process",
            n.MESSAGING_OPERATION_NAME: "process",
            n.MESSAGING_SUBSCRIPTION: claim.subscription,
            n.JOB_TYPE: claim.job_type,
            n.TARGET_CLASS: claim.target_class.value,
            n.ATTEMPT: claim.attempts,
            n.FENCE: claim.fence,
            n.TAKEOVER: claim.takeover,
            n.TENANT_HASH: self._hasher.tenant(claim.tenant_id),
            n.OPERATION_HASH: self._hasher.operation(claim.tenant_id, claim.operation_id),
        }
        if claim.broker_message_id and claim.broker_message_id != claim.operation_id:
            attributes[n.MESSAGING_MESSAGE_ID] = claim.broker_message_id
        return attributes

    @contextmanager
    def process(self, claim: Claim) -> Iterator[trace.Span]:
        """The span of one run: claim → execute → settle, linked to the producer's span."""
        with trace.use_span(self.begin(claim), end_on_exit=True) as span:
            yield span

    def begin(self, claim: Claim) -> trace.Span:
        """:meth:`process`'s span, started but not made current, for a run that ends after its
        thread moved on (a settlement answered later): the caller makes it current where the
        run's events are reported (``trace.use_span``) and ends it."""
        link = link_to(claim.trace_context)
        span = self._tracer.start_span(
            n.SPAN_PROCESS.format(subscription=claim.subscription),
            kind=trace.SpanKind.CONSUMER,
            links=[link] if link else [],
            # from the start: it marks the span as the root of an operation's trace
            attributes={n.MESSAGING_SUBSCRIPTION: claim.subscription},
        )
        if span.is_recording():  # keyed hashes cost a few HMACs; skip them when unused
            span.set_attributes(self._claim_attributes(claim))
        return span

    def _labels(self, claim: Claim, **more: str) -> dict[str, str]:
        return {n.LABEL_JOB_TYPE: claim.job_type, **more}

    def _log(self, message: str, claim: Claim, **fields: str) -> None:
        decisions_log.warning(
            message,
            extra={
                "fencebridge": {
                    n.JOB_TYPE: claim.job_type,
                    n.TENANT_HASH: self._hasher.tenant(claim.tenant_id),
                    n.OPERATION_HASH: self._hasher.operation(claim.tenant_id, claim.operation_id),
                    n.FENCE: str(claim.fence),
                    **fields,
                }
            },
        )

    # WorkEvents

    def claimed(self, claim: Claim) -> None:
        if claim.takeover:
            self._takeovers.add(1, self._labels(claim))

    def run_finished(self, claim: Claim, seconds: float) -> None:
        """A run concluded (settled, or learned it lost the row) ``seconds`` after its claim."""
        self._claim_to_settle.record(seconds, self._labels(claim))

    def settled(self, claim: Claim, state: State, code: str) -> None:
        span = trace.get_current_span()
        span.set_attribute(n.OUTCOME, state.value)
        span.set_attribute(n.OUTCOME_CODE, code)
        if state is not State.SUCCEEDED:  # a retry, a failure, a park: what error searches find
            _failed(span, code or state.value, f"{state.value}: {code}" if code else state.value)
        if state is State.UNKNOWN:
            span.add_event(n.EVENT_PARKED_UNKNOWN, {n.OUTCOME_CODE: code})
            self._log("operation parked as unknown: reconcile before any retry", claim)
        elif state is State.QUARANTINED:
            self._log(
                "operation quarantined by its handler: for the producer team",
                claim,
                **{n.OUTCOME_CODE: code},
            )
        self._completions.add(1, self._labels(claim, **{n.LABEL_OUTCOME: state.value}))

    def lease_lost(self, claim: Claim, action: str) -> None:
        span = trace.get_current_span()
        span.add_event(n.EVENT_LEASE_LOST, {n.ACTION: action})
        _failed(span, "lease_lost", f"lease lost at {action}")
        self._lease_lost.add(1, self._labels(claim, **{n.LABEL_ACTION: action}))
        self._log("lease lost: the fence refused this claim's write", claim, **{n.ACTION: action})

    def fenced_out(self, claim: Claim) -> None:
        span = trace.get_current_span()
        span.add_event(n.EVENT_FENCED_OUT)
        _failed(span, "fenced_out", "stale write fenced out by the target")
        self._fenced_out.add(1, self._labels(claim))
        self._log("stale write fenced out by the target", claim)

    def reconciled(self, claim: Claim, finding: str) -> None:
        trace.get_current_span().add_event(n.EVENT_RECONCILED, {n.FINDING: finding})
        self._reconciliations.add(1, self._labels(claim, **{n.LABEL_FINDING: finding}))

    def rate_wait_clamped(self, claim: Claim, asked: timedelta) -> None:
        seconds = asked.total_seconds()
        trace.get_current_span().add_event(n.EVENT_RATE_WAIT_CLAMPED, {n.RATE_WAIT_ASKED: seconds})
        self._rate_wait_clamped.add(1, self._labels(claim))
        self._log(
            "rate limit wait longer than the job type's maximum: cut to it",
            claim,
            **{n.RATE_WAIT_ASKED: f"{seconds:g}"},
        )

    def settle_unknown(self, claim: Claim, action: str) -> None:
        trace.get_current_span().add_event(n.EVENT_SETTLE_UNKNOWN, {n.ACTION: action})
        self._log(
            "settlement outcome unknown (database unavailable); the lease will lapse",
            claim,
            **{n.ACTION: action},
        )

    def observe_stream(self, subscription: str, counts: Callable[[], Mapping[str, int]]) -> None:
        """Export a consumer's running counters (event name -> total) as stream events."""
        with self._streams_lock:
            self._streams[subscription] = counts

    def _observe_streams(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._streams_lock:
            streams = list(self._streams.items())
        for subscription, counts in streams:
            try:
                snapshot = dict(counts())
            except Exception as exc:  # noqa: BLE001  (an exporter callback must not raise)
                log.debug("stream counters unavailable (%s)", type(exc).__name__)
                continue
            for event, total in sorted(snapshot.items()):
                if event.startswith("decision.") or event == "held":
                    continue  # decisions are fencebridge.deliveries; held is not a total
                yield Observation(total, {n.LABEL_SUBSCRIPTION: subscription, n.LABEL_EVENT: event})

    # -- supervision -------------------------------------------------------------------------------

    def thread_restarted(self, service: str) -> None:
        """A supervised loop failed and is being restarted (``service`` is its only label)."""
        self._restarts.add(1, {n.LABEL_SERVICE: service})

    # -- gauges read from the database ----------------------------------------------------------

    def observe(
        self,
        store: GaugeSource,
        interval: float = STATS_REFRESH_SECONDS_DEFAULT,
        limits: Mapping[str, ConcurrencyLimit] | None = None,
        outbox: Callable[[], Sequence[OutboxBacklog]] | None = None,
        destinations: Sequence[str] = (),
        *,
        rates: Mapping[str, TokenRate] | None = None,
        subscriptions: Sequence[str] = (),
    ) -> None:
        """Register the database gauges, refreshed by a background thread every ``interval``.
        ``limits`` and ``rates``: the concurrency limits and token rates the bridge claims
        under (for the waiting gauge; the store's own where not given);
        ``outbox`` reads the outbox backlog of the configured ``destinations`` (each is
        reported, 0 when it has nothing pending). The queue depth reports the configured
        ``subscriptions`` and every other one seen with open or parked rows, 0 when none is
        queued.

        Each refresh reads open and parked rows only (:meth:`GaugeSource.open_stats`): a
        count of every row, history included, grew with the table until it neared the
        statement timeout at a few million rows, in every replica at once.

        Once per Telemetry: a second call does nothing. :meth:`stop_observing` ends the thread.
        The thread is supervised (:attr:`gauges`): a failed reading clears the gauges, and is
        logged, counted and retried.
        """
        with self._stats_lock:
            if self._observing is not None:
                return
            self._observing = threading.Event()
            self._subscriptions.update(subscriptions)
        stop = self._observing

        def refresh() -> None:
            try:
                stats = store.open_stats()
                waiting = store.waiting(limits, rates)
                backlog = list(outbox()) if outbox is not None else []
            except Exception:
                with self._stats_lock:
                    self._stats = None  # a stale reading must not pass for a current one
                    self._waiting = []
                    self._outbox = None
                raise
            with self._stats_lock:
                self._stats = stats
                self._subscriptions.update(c.subscription for c in stats.counts)
                self._waiting = waiting
                self._outbox = dict.fromkeys(destinations, (0, 0.0, 0))
                for b in backlog:
                    self._outbox[b.destination] = (
                        b.pending,
                        b.oldest_pending_seconds or 0.0,
                        b.parked,
                    )

        self.gauges = Supervised(
            "gauges",
            refresh,
            every=interval,
            stop=stop,
            on_restart=self.thread_restarted,
            thread_name="fencebridge-stats",
        )
        self.gauges.start()
        self._meter.create_observable_gauge(
            n.METRIC_STALLED,
            [self._observe_stalled],
            unit="{claim}",
            description="Claimed rows whose lease expired",
        )
        self._meter.create_observable_gauge(
            n.METRIC_OLDEST_UNKNOWN,
            [self._observe_oldest_unknown],
            unit="s",
            description="Age of the oldest row parked as unknown",
        )
        self._meter.create_observable_gauge(
            n.METRIC_QUARANTINED,
            [self._observe_quarantined],
            unit="{record}",
            description="Quarantined work rows and deliveries",
        )
        self._meter.create_observable_gauge(
            n.METRIC_QUEUE_DEPTH,
            [self._observe_depth],
            unit="{operation}",
            description="Queued rows per subscription",
        )
        self._meter.create_observable_gauge(
            n.METRIC_WAITING,
            [self._observe_waiting],
            unit="{operation}",
            description="Due rows that cannot be claimed now, by reason, job type and tenant hash",
        )

        if outbox is not None:
            self._meter.create_observable_gauge(
                n.METRIC_OUTBOX_PENDING,
                [partial(self._observe_outbox, 0)],
                unit="{message}",
                description="Outbox messages committed and not sent yet, per destination",
            )
            self._meter.create_observable_gauge(
                n.METRIC_OUTBOX_OLDEST,
                [partial(self._observe_outbox, 1)],
                unit="s",
                description="Age of the oldest unsent outbox message, per destination",
            )
            self._meter.create_observable_gauge(
                n.METRIC_OUTBOX_PARKED,
                [partial(self._observe_outbox, 2)],
                unit="{message}",
                description="Outbox messages the relay gave up on, per destination",
            )

    def _observe_outbox(self, field: int, _options: CallbackOptions) -> Iterable[Observation]:
        with self._stats_lock:
            backlog = dict(self._outbox) if self._outbox is not None else None
        if backlog is None:
            return []
        return [
            Observation(values[field], {n.LABEL_DESTINATION: destination})
            for destination, values in sorted(backlog.items())
        ]

    def stop_observing(self) -> None:
        with self._stats_lock:
            if self._observing is not None:
                self._observing.set()

    def _snapshot(self) -> Stats | None:
        with self._stats_lock:
            return self._stats

    def _observe_waiting(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._stats_lock:
            waiting = list(self._waiting)
        return [
            Observation(
                w.count,
                {
                    n.LABEL_REASON: w.reason,
                    n.LABEL_JOB_TYPE: w.job_type,
                    n.LABEL_TENANT_HASH: self._hasher.tenant(w.tenant_id),
                },
            )
            for w in waiting
        ]

    def _observe_stalled(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._snapshot()
        return [Observation(stats.stalled_claims)] if stats else []

    def _observe_oldest_unknown(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._snapshot()
        return [Observation(stats.oldest_unknown_seconds or 0.0)] if stats else []

    def _observe_quarantined(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._snapshot()
        if not stats:
            return []
        return [
            Observation(stats.total(State.QUARANTINED), {n.LABEL_KIND: "work_row"}),
            Observation(stats.rejected.get("quarantined", 0), {n.LABEL_KIND: "delivery"}),
        ]

    def _observe_depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._stats_lock:
            stats, known = self._stats, sorted(self._subscriptions)
        if not stats:
            return []
        # Every subscription configured or seen with rows is reported, 0 when none is queued:
        # a drained queue is a value, not a missing series.
        depth = dict.fromkeys(known, 0)
        for count in stats.counts:
            queued = count.count if count.state is State.QUEUED else 0
            depth[count.subscription] = depth.get(count.subscription, 0) + queued
        return [Observation(v, {n.LABEL_SUBSCRIPTION: k}) for k, v in sorted(depth.items())]
