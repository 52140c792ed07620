"""The tables of the configuration file, as models: each key once, with its type, range,
default and documentation, which the reader, the reference and the JSON Schema all use.

The keys of a subscription that belong to its broker are not here: the adapter declares them
(:class:`~bridge.adapters.sources.SourceSettings`) and :attr:`SubscriptionConfig.settings` holds
them.
"""

from __future__ import annotations

import enum
import inspect
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, Final, Self

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    model_validator,
)

from bridge.config.fields import (
    DecodeSource,
    HostName,
    Identifier,
    ImportPath,
    Name,
    OperationSource,
    Payload,
    RateText,
    Shown,
    Table,
    distinct,
    invalid,
    invalid_all,
)
from bridge.database import (
    IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
    KEEPALIVES_COUNT_DEFAULT,
    KEEPALIVES_IDLE_DEFAULT,
    KEEPALIVES_INTERVAL_DEFAULT,
    LOCK_TIMEOUT_DEFAULT,
    STATEMENT_TIMEOUT_DEFAULT,
    TCP_USER_TIMEOUT_DEFAULT,
    SessionTimeouts,
)
from bridge.errors import ConfigError
from bridge.handlers import RATE_LIMIT_WAIT_MAX_DEFAULT
from bridge.ingest.decode import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DecodeRules,
    JobRule,
    PayloadSource,
    SourceKind,
)
from bridge.service import (
    UNHEALTHY_AFTER_RESTARTS_DEFAULT,
    UNHEALTHY_AFTER_SECONDS_DEFAULT,
    Limits,
)
from bridge.store.work import (
    ATTEMPT_HISTORY_DEFAULT,
    PRIORITY_AGING_DEFAULT,
    RATE_MAX,
    TOMBSTONE_DAYS_DEFAULT,
    ConcurrencyLimit,
    TokenRate,
)
from bridge.types import TargetClass

WORKER_THREADS_DEFAULT: Final = 8
POLL_INTERVAL_SECONDS_DEFAULT: Final = 1.0
#: rows a worker pool claims beyond its threads, by default: none, so a process holds no more
#: rows than it runs (a prefetch pays for quick handlers at high rates: docs/benchmarks.md,
#: "Inbox to settle, end to end")
PREFETCH_DEFAULT: Final = 0
SWEEP_INTERVAL_SECONDS_DEFAULT: Final = 15.0
SHUTDOWN_DEADLINE_SECONDS_DEFAULT: Final = 30.0
HEALTH_HOST_DEFAULT: Final = "127.0.0.1"
HEALTH_PORT_DEFAULT: Final = 8080

MAX_ATTEMPTS_DEFAULT: Final = 5
#: class D targets have neither fence nor idempotency key: one attempt, ever
MAX_ATTEMPTS_CLASS_D: Final = 1
LEASE_SECONDS_DEFAULT: Final = 60.0
BACKOFF_INITIAL_SECONDS_DEFAULT: Final = 1.0
BACKOFF_MAX_SECONDS_DEFAULT: Final = 300.0
#: the largest concurrency limit of a job type (runs at once across every process)
CONCURRENCY_MAX: Final = 100_000

#: the largest SQS message (1 MiB); Pub/Sub allows up to 10 MB
MAX_BODY_BYTES_DEFAULT: Final = 1_048_576


#: the largest tenant backlog quota (rows)
BACKLOG_QUOTA_MAX: Final = 100_000_000


class AckMode(enum.StrEnum):
    """When a delivery is acknowledged to its broker."""

    AFTER_INBOX = "after_inbox"  #: once its work row has committed
    AFTER_OUTCOME = "after_outcome"  #: once its work row is terminal or parked


ACK_MODE_DEFAULT: Final = AckMode.AFTER_INBOX


class SubscriptionMode(enum.StrEnum):
    """Whether a subscription's deliveries become work, or are only recorded for comparison."""

    LIVE = "live"  #: work rows, claimed and run
    SHADOW = "shadow"  #: recorded apart (shadow tables), never claimable, no handler called


def default_worker_id() -> str:
    """``<hostname>-<pid>``: unique per process on a host, readable in status output."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _doc(text: str) -> str:
    return inspect.cleandoc(text)


class BridgeSettings(Table):
    """Settings of the bridge process. Every key is optional."""

    worker_id: Annotated[Identifier, Shown(default='`"<hostname>-<pid>"`')] = Field(
        default_factory=default_worker_id,
        description=_doc(
            """
            Names this process as the lease owner of the rows it claims. Give every running
            process its own: the id is how status output and logs tell claims apart (the
            fence, not this id, is what keeps their writes apart).
            """
        ),
    )
    worker_threads: StrictInt = Field(
        default=WORKER_THREADS_DEFAULT,
        ge=1,
        le=256,
        description="Handlers that run at once in this process.",
    )
    claim_batch: Annotated[StrictInt | None, Shown(default="`worker_threads`")] = Field(
        default=None,
        ge=1,
        le=1000,
        description=_doc(
            """
            Most work rows one claim statement leases. A claimer never claims more rows than
            it has idle workers, so by default one statement refills every worker a batch of
            settlements freed: split into smaller claims, the refill costs a statement each
            (with 16 workers and 10 here, two of them in every claim transaction).
            """
        ),
    )
    prefetch: StrictInt = Field(
        default=PREFETCH_DEFAULT,
        ge=0,
        le=1000,
        description=_doc(
            """
            Work rows claimed beyond `worker_threads`, waiting for a thread: while the next
            claim is in flight the threads run these instead of waiting for it. A quick handler
            at a high rate gains (docs/benchmarks.md, "Inbox to settle, end to end"); a slow one
            only holds rows other processes could run. A row whose lease ran out while it
            waited is given back, never run.
            """
        ),
    )
    poll_interval_seconds: StrictFloat = Field(
        default=POLL_INTERVAL_SECONDS_DEFAULT,
        gt=0,
        le=3600,
        description=(
            "Pause before the next claim of any claimable row (a retry come due, a lapsed "
            "lease, a row another process wrote) once the last one came back short; rows the "
            "inbox writes claimed or hands off never wait for it."
        ),
    )
    sweep_interval_seconds: StrictFloat = Field(
        default=SWEEP_INTERVAL_SECONDS_DEFAULT,
        gt=0,
        le=3600,
        description=_doc(
            """
            How often the sweeper looks for claims whose lease expired with no attempt left
            and parks them as `unknown` (a class D claim that expired before it recorded its
            intent made no call, and goes back to the queue instead).
            """
        ),
    )
    shutdown_deadline_seconds: StrictFloat = Field(
        default=SHUTDOWN_DEADLINE_SECONDS_DEFAULT,
        ge=0,
        le=3600,
        description=_doc(
            """
            On SIGTERM, how long running handlers get to finish. A claim still open after it
            is left to lease expiry; its fence keeps any late write out.
            """
        ),
    )
    statement_timeout_seconds: StrictFloat = Field(
        default=STATEMENT_TIMEOUT_DEFAULT.total_seconds(),
        ge=0,
        le=86400,
        description=_doc(
            """
            Longest any one statement of the bridge may run (PostgreSQL's `statement_timeout`
            on every pooled connection). Past it the server cancels the statement and rolls it
            back: the caller gets a clear error, nothing was applied, and the work is retried
            the way a database outage is. A class A transaction uses the handler's deadline
            instead. `0` leaves the server's setting.
            """
        ),
    )
    lock_timeout_seconds: StrictFloat = Field(
        default=LOCK_TIMEOUT_DEFAULT.total_seconds(),
        ge=0,
        le=86400,
        description=_doc(
            """
            Longest a statement of the bridge waits for a row or table lock (`lock_timeout`),
            including a class A handler's business rows. A wait that long means something else
            holds the lock; the statement is rolled back and retried later instead of queueing
            behind it. `0` leaves the server's setting.
            """
        ),
    )
    tcp_keepalives_idle_seconds: StrictInt = Field(
        default=int(KEEPALIVES_IDLE_DEFAULT.total_seconds()),
        ge=0,
        le=7200,
        description=_doc(
            """
            Seconds a database connection may stay silent before TCP keepalive probes start
            (libpq `keepalives_idle`); with the interval and count below, a connection idle
            in the pool across a silent partition is given up in about 25 s. `0` leaves the
            operating system's setting. A setting in the database URL wins.
            """
        ),
    )
    tcp_keepalives_interval_seconds: StrictInt = Field(
        default=int(KEEPALIVES_INTERVAL_DEFAULT.total_seconds()),
        ge=0,
        le=600,
        description="Seconds between two keepalive probes (`keepalives_interval`); `0`: the "
        "operating system's.",
    )
    tcp_keepalives_count: StrictInt = Field(
        default=KEEPALIVES_COUNT_DEFAULT,
        ge=0,
        le=100,
        description="Unanswered probes before the connection is given up (`keepalives_count`); "
        "`0`: the operating system's.",
    )
    tcp_user_timeout_seconds: StrictFloat = Field(
        default=TCP_USER_TIMEOUT_DEFAULT.total_seconds(),
        ge=0,
        le=3600,
        description=_doc(
            """
            Longest bytes sent to the database may stay unacknowledged before the connection
            is broken (libpq `tcp_user_timeout`, Linux): a statement sent into a silent
            partition fails then, instead of waiting for the kernel's retransmissions (about
            15 minutes); the server's `statement_timeout` cannot end it, since its answer
            never arrives. `0` leaves the operating system's setting.
            """
        ),
    )
    idle_in_transaction_timeout_seconds: StrictFloat = Field(
        default=IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT.total_seconds(),
        ge=0,
        le=86400,
        description=_doc(
            """
            Longest a connection of the bridge may sit idle inside an open transaction
            (`idle_in_transaction_session_timeout`). Past it the server ends the session, which
            rolls the transaction back and releases every lock it held: a handler stuck in a
            call can never hold rows and a connection forever. A class A transaction uses the
            handler's deadline instead. `0` leaves the server's setting.
            """
        ),
    )
    unhealthy_after_seconds: StrictFloat = Field(
        default=UNHEALTHY_AFTER_SECONDS_DEFAULT,
        ge=1,
        le=86400,
        description=_doc(
            """
            How long a service of the bridge (claimer, workers, heartbeater, sweeper...) may
            keep failing before `/healthz` fails too, so the orchestrator restarts the process.
            Until then only `/readyz` fails. A dependency that cannot be reached at all never
            fails `/healthz`: a restart would not bring it back.
            """
        ),
    )
    unhealthy_after_restarts: StrictInt = Field(
        default=UNHEALTHY_AFTER_RESTARTS_DEFAULT,
        ge=1,
        le=1_000_000,
        description="Restarts in a row of one service, without a good round between them, after"
        " which `/healthz` fails.",
    )
    attempt_history: StrictInt = Field(
        default=ATTEMPT_HISTORY_DEFAULT,
        ge=0,
        le=1000,
        description=_doc(
            """
            Attempts kept per work row in its history (`fencebridge inspect`): each attempt is
            recorded by the statement that ends it, which trims the oldest, and the history
            goes with the row when it is purged or erased. At least 2 are kept when on (an
            attempt taken over and the one taking over); `0` records none.
            """
        ),
    )
    tenant_fairness: StrictBool = Field(
        default=True,
        description=_doc(
            """
            Claims take tenants in turn: each claim walks the tenants that have rows queued,
            starting after the last one served, and takes each tenant's share of the claim
            (`tenant_weights`), its oldest due rows first; what a tenant with fewer rows due
            leaves of its share goes to the others. One tenant's flood then waits behind
            itself while the other tenants' rows are claimed. Each process keeps its own place
            in the walk. `false` claims in the order rows became due (and by priority), whoever
            they belong to. A job type with a concurrency limit is claimed in that order too:
            its limit per tenant is what keeps one tenant from taking every slot.
            """
        ),
    )
    tenant_weights: Annotated[
        dict[Identifier, Annotated[StrictInt, Field(ge=1, le=1000)]],
        Shown(kind="table of tenant id = weight (1 to 1000)", default="every tenant 1"),
    ] = Field(
        default_factory=dict,
        description=_doc(
            """
            Shares of a tenant-fair claim other than 1: a tenant of weight 3 takes up to three
            rows for each one of a tenant of weight 1 while both have work queued. Keyed by
            tenant id (the configuration is the one place raw tenant ids are written; nothing
            reports them).
            """
        ),
    )
    priority_aging_seconds: StrictFloat = Field(
        default=PRIORITY_AGING_DEFAULT.total_seconds(),
        ge=0,
        le=86400,
        description=_doc(
            """
            How far one step of priority (`[jobs.<name>] priority`, `decode.priority`) moves a
            row ahead in the claim order: a row of priority `p` overtakes rows that became due
            up to `p` times this many seconds before it, and no more, so a row of lower
            priority waits a bounded time, never forever. With `tenant_fairness`, priority
            orders each tenant's rows; tenants still take turns.
            """
        ),
    )
    tenant_backlog_quota: Annotated[StrictInt | None, Shown(default="none")] = Field(
        default=None,
        ge=1,
        le=BACKLOG_QUOTA_MAX,
        description=_doc(
            """
            Most open work rows (`queued` and `claimed`, of every subscription) one tenant may
            have. A new operation of a tenant at the quota is not written and not acknowledged:
            it stays with the broker (counted `deferred_quota`) and is written when it comes
            back below the quota, so one tenant's flood waits in the queue while the others
            flow. Replays and conflicts are decided as always. Concurrent writers can pass it
            by one batch each. A subscription may set its own.
            """
        ),
    )
    health_host: HostName = Field(
        default=HEALTH_HOST_DEFAULT, description="Address the health endpoint listens on."
    )
    health_port: StrictInt = Field(
        default=HEALTH_PORT_DEFAULT,
        ge=0,
        le=65535,
        description="Port of `/healthz` (liveness) and `/readyz` (readiness); `0` disables both.",
    )

    def limits(self) -> Limits:
        """When a failing service makes the process unhealthy, not only unready."""
        return Limits(
            failing_seconds=self.unhealthy_after_seconds, restarts=self.unhealthy_after_restarts
        )

    def session_timeouts(self) -> SessionTimeouts:
        """The limits every pooled connection of the bridge starts with."""

        def limit(seconds: float) -> timedelta | None:
            return timedelta(seconds=seconds) if seconds > 0 else None

        return SessionTimeouts(
            statement=limit(self.statement_timeout_seconds),
            lock=limit(self.lock_timeout_seconds),
            idle_in_transaction=limit(self.idle_in_transaction_timeout_seconds),
            keepalives_idle=limit(self.tcp_keepalives_idle_seconds),
            keepalives_interval=limit(self.tcp_keepalives_interval_seconds),
            keepalives_count=self.tcp_keepalives_count or None,
            tcp_user_timeout=limit(self.tcp_user_timeout_seconds),
        )


class JobConfig(Table):
    """One table per job type. `<name>` is the job type a delivery decodes to (1 to 64 letters,
    digits, `_`, `.` or `-`, starting with a letter or digit); subscriptions list the job
    types they accept in `job_types`.
    """

    handler: ImportPath = Field(
        description=_doc(
            """
            The handler, as an import path `module.path:attribute`. Only the spelling is
            checked when the file is read; the bridge imports it when it starts.
            """
        )
    )
    target_class: TargetClass = Field(
        description=_doc(
            """
            Where the handler's side effect lands, which decides what the fence can
            guarantee. `A`: the same PostgreSQL database as the work table; the business
            write commits with the settlement, under the fence. `B`: a store with conditional
            writes that keeps the last fence and refuses lower ones. `C`: an external API with
            an idempotency key and a lookup by key; after an ambiguous attempt the bridge looks
            the key up before acting again (dedupe, not fencing). `D`: none of these; at most
            one attempt, its intent recorded first, and an ambiguous result is parked as
            `unknown`. There is no default: the class is a statement about the target that
            only its owner can make.
            """
        )
    )
    max_attempts: Annotated[
        StrictInt,
        Shown(default=f"`{MAX_ATTEMPTS_DEFAULT}` (class `D`: `{MAX_ATTEMPTS_CLASS_D}`)"),
    ] = Field(
        default=MAX_ATTEMPTS_DEFAULT,
        ge=1,
        le=100,
        description=_doc(
            """
            Claims a row may take. With none left, a retryable failure becomes
            `failed_terminal`, and a claim whose lease expires is parked as `unknown`: never
            retried, never assumed failed. Class `D` allows exactly one: leave the key out or
            set it to 1.
            """
        ),
    )
    lease_seconds: StrictFloat = Field(
        default=LEASE_SECONDS_DEFAULT,
        gt=0,
        le=86400,
        description=_doc(
            """
            Length of a claim's lease. It is liveness only: heartbeats renew it while the
            handler reports progress, and once it lapses another worker may take the row over
            under a higher fence, which refuses every later write of the first one.
            """
        ),
    )
    backoff_initial_seconds: StrictFloat = Field(
        default=BACKOFF_INITIAL_SECONDS_DEFAULT,
        ge=0,
        le=86400,
        description=_doc(
            """
            Delay before the first retry after a retryable failure; later retries wait longer
            (exponential backoff), up to `backoff_max_seconds`.
            """
        ),
    )
    backoff_max_seconds: StrictFloat = Field(
        default=BACKOFF_MAX_SECONDS_DEFAULT,
        ge=0,
        le=86400,
        description="Longest retry delay; at least `backoff_initial_seconds`.",
    )
    rate_limit_wait_max_seconds: StrictFloat = Field(
        default=RATE_LIMIT_WAIT_MAX_DEFAULT.total_seconds(),
        gt=0,
        le=86400,
        description=_doc(
            """
            Longest wait a `RateLimited` answer (a `429` and its `Retry-After`) holds this job
            type's rows of the tenant for. A longer wait is cut to this and counted
            (`fencebridge.rate_limit.clamped`), and the next attempt asks the target again: no
            single answer (a provider's mistake, a daily quota, a date far ahead) holds a
            tenant's work for longer. `fencebridge rate-wait clear` lifts a wait at once.
            """
        ),
    )
    concurrency: Annotated[StrictInt | None, Shown(default="unlimited")] = Field(
        default=None,
        ge=1,
        le=CONCURRENCY_MAX,
        description=_doc(
            """
            Most rows of this job type claimed at once, across every bridge process: the
            claim statements count the claimed rows in the database, under a lock per job
            type, so two processes never both take the last slot. A row over the limit stays
            queued and uses no attempt. A claim whose lease expired keeps its slot until the
            row is settled (its worker may still be acting); a takeover of it reuses that slot.
            Every process claiming the job type must set the same limit.
            """
        ),
    )
    concurrency_per_tenant: Annotated[StrictInt | None, Shown(default="unlimited")] = Field(
        default=None,
        ge=1,
        le=CONCURRENCY_MAX,
        description=_doc(
            """
            Most rows of this job type and one tenant claimed at once, across every bridge
            process, counted like `concurrency`; at most `concurrency` when both are set. A
            limit per another key of the delivery (a customer the decode rules could extract)
            is not supported yet.
            """
        ),
    )
    rate: Annotated[RateText | None, Shown(default="unlimited")] = Field(
        default=None,
        description=_doc(
            """
            Most runs of this job type started per second, minute or hour, across every
            bridge process: a token bucket of `burst` tokens, refilled at this rate from the
            database clock. Every run a claim starts spends a token, a takeover of an expired
            lease too (it calls the target again); the claim statements count and spend them
            in the database, under the same lock per job type as `concurrency`, so two
            processes never both spend the last token. A row with no token for it stays
            queued, uses no attempt and holds no worker; `fencebridge status` counts it as
            waiting for `rate`. Every process claiming the job type must set the same rate.
            """
        ),
    )
    burst: Annotated[StrictInt | None, Shown(default="one second of `rate`, at least 1")] = Field(
        default=None,
        ge=1,
        le=RATE_MAX,
        description=_doc(
            """
            Most runs of this job type started at once when its bucket is full: in any
            window of `w` seconds, at most `burst + rate * w` runs start. Only with `rate`.
            """
        ),
    )
    rate_per_tenant: Annotated[RateText | None, Shown(default="unlimited")] = Field(
        default=None,
        description=_doc(
            """
            Most runs of this job type and one tenant started per second, minute or hour,
            across every bridge process: a bucket per tenant, counted like `rate` and together
            with it (a run spends a token of both). At most `rate` when both are set.
            """
        ),
    )
    burst_per_tenant: Annotated[
        StrictInt | None, Shown(default="one second of `rate_per_tenant`, at least 1")
    ] = Field(
        default=None,
        ge=1,
        le=RATE_MAX,
        description=_doc(
            """
            Most runs of this job type and one tenant started at once when the tenant's bucket
            is full. Only with `rate_per_tenant`; at most `burst` when both are set.
            """
        ),
    )
    priority: StrictInt = Field(
        default=0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description=_doc(
            """
            Claimed ahead of lower priorities by `priority` times
            `[bridge] priority_aging_seconds` of claim order (aging: a lower priority is
            overtaken for that long, never starved). A subscription's `decode.priority` may give
            a delivery its own.
            """
        ),
    )
    owner: Identifier | None = Field(
        default=None,
        description=_doc(
            """
            Who owns this job type's parked and failed rows (`unknown`, `quarantined`,
            `failed_terminal`): a team or on-call rotation, named where alerts are routed.
            `fencebridge check` reports no-go for a job type without one.
            """
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _one_attempt_for_class_d(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("target_class") == TargetClass.D:
            return {"max_attempts": MAX_ATTEMPTS_CLASS_D, **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.target_class is TargetClass.D and self.max_attempts != MAX_ATTEMPTS_CLASS_D:
            raise invalid(
                "class D (no fence, no idempotency key) allows one attempt only; set 1 or leave "
                f"it out, got {self.max_attempts}",
                key=("max_attempts",),
            )
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise invalid(
                f"must be at least backoff_initial_seconds "
                f"({_number(self.backoff_initial_seconds)}), "
                f"got {_number(self.backoff_max_seconds)}",
                key=("backoff_max_seconds",),
            )
        if (
            self.concurrency is not None
            and self.concurrency_per_tenant is not None
            and self.concurrency_per_tenant > self.concurrency
        ):
            raise invalid(
                f"must be at most concurrency ({self.concurrency}), the limit of the whole "
                f"job type, got {self.concurrency_per_tenant}",
                key=("concurrency_per_tenant",),
            )
        self._rates_consistent()
        return self

    def _rates_consistent(self) -> None:
        for burst, rate, name in (
            (self.burst, self.rate, "rate"),
            (self.burst_per_tenant, self.rate_per_tenant, "rate_per_tenant"),
        ):
            if burst is not None and rate is None:
                raise invalid(
                    f"a burst needs its rate: set {name} too, or leave the burst out",
                    key=(f"burst{name.removeprefix('rate')}",),
                )
        if (
            self.rate is not None
            and self.rate_per_tenant is not None
            and self.rate_per_tenant.per_second > self.rate.per_second
        ):
            raise invalid(
                f"must be at most rate ({self.rate}), the rate of the whole job type, got "
                f"{self.rate_per_tenant}",
                key=("rate_per_tenant",),
            )
        buckets = self.token_rate.buckets()
        total, tenant = buckets[2], buckets[5]
        if total is not None and tenant is not None and tenant > total:
            raise invalid(
                f"must be at most burst ({total}"
                f"{'' if self.burst is not None else ', one second of rate'}), the burst of "
                f"the whole job type, got {tenant}",
                key=("burst_per_tenant",),
            )

    @property
    def concurrency_limit(self) -> ConcurrencyLimit:
        """The job type's concurrency limits as the store's claims take them."""
        return ConcurrencyLimit(total=self.concurrency, per_tenant=self.concurrency_per_tenant)

    @property
    def token_rate(self) -> TokenRate:
        """The job type's token rates as the store's claims take them."""
        return TokenRate(
            total=self.rate,
            burst=self.burst,
            per_tenant=self.rate_per_tenant,
            burst_per_tenant=self.burst_per_tenant,
        )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


class DecodeConfig(Table):
    """How a delivery becomes an operation: where each part of its identity is read, and
    which bytes are its payload. Field sources and the decoding rules are described below;
    whatever cannot be read with confidence is quarantined with a reason, never guessed.
    """

    tenant_id: DecodeSource = Field(
        description=_doc(
            """
            The tenant, part of every key. `value:` suits a subscription that carries one
            tenant's traffic only.
            """
        )
    )
    operation_id: OperationSource = Field(
        description=_doc(
            """
            The operation's identity, from the producer's business intent (the refund request
            id): never a timestamp, a retry counter or a constant, so `value:` is refused.
            `message_id` needs `operation_id_from_message_id = true`.
            """
        )
    )
    job_type: DecodeSource = Field(
        description=_doc(
            """
            The job type; it must be one of the subscription's `job_types`. `value:` suits a
            subscription that carries one job type.
            """
        )
    )
    schema_version: DecodeSource | None = Field(
        default=None,
        description=_doc(
            """
            The payload's schema version, stored on the work row. Required when
            `schema_versions` is not empty; without a source no version is recorded.
            """
        ),
    )
    priority: DecodeSource | None = Field(
        default=None,
        description=_doc(
            """
            A delivery's own priority, in place of its job type's: a whole number from
            -1000 to 1000, as a JSON integer or its decimal text. Absent or `null`, the job
            type's priority applies; anything else is quarantined (`invalid_priority`).
            """
        ),
    )
    payload: Payload = Field(
        default_factory=PayloadSource,
        description=_doc(
            """
            The approved payload: the bytes that are hashed (sha256) to bind the operation,
            and stored for the handler. `body` is the raw body, byte for byte, never parsed:
            any format, and one changed byte is a conflict. `body:/pointer` is the canonical
            JSON of the value at that pointer (`body:` alone: the whole document), so a
            producer that reorders keys or changes whitespace still replays instead of
            conflicting.
            """
        ),
    )
    operation_id_from_message_id: StrictBool = Field(
        default=False,
        description=_doc(
            """
            Allows `operation_id = "message_id"`, an explicit opt-in because it is weaker. A
            broker's message id names one send, not one intent: a producer that resends after
            a timeout gets a new message id, so two deliveries of one intent become two
            operations and nothing deduplicates them. An SQS MessageId is stable only across
            redeliveries of the same send (a Pub/Sub message id likewise). Use it only for a
            producer that cannot carry an intent id, and only when a duplicate effect is
            acceptable.
            """
        ),
    )


class SourceSettings(Table):
    """An adapter's keys of a subscription table, beside the core's. Its docstring opens the
    adapter's section of the reference; each field's description documents its key."""

    def receivers(self) -> int:
        """Threads of the consumer that may hold a database connection at once (pool sizing)."""
        return 1

    def address(self) -> str | None:
        """What the consumer reads from (a queue URL, a subscription path), when the adapter
        can name it: a shadow subscription must not read what a live one reads."""
        return None

    @classmethod
    def of(cls, sub: SubscriptionConfig) -> Self:
        """The subscription's settings, if they are this adapter's (guards direct use)."""
        if not isinstance(sub.settings, cls):
            raise ConfigError(
                f"subscriptions.{sub.name}: source {sub.source!r} is not read by {cls.__name__}"
            )
        return sub.settings


#: the validation context key naming every declared job table (None: [jobs] is unusable)
DECLARED_JOBS: Final = "declared_jobs"


class SubscriptionConfig(Table):
    """One table per broker subscription. `<name>` (same rule as job type names) is stored on
    every work row the subscription creates. `source` names the broker adapter, which owns
    the rest of the table's keys: they are listed under the source below, and a key of another
    source is an error.
    """

    source: Annotated[
        StrictStr, Shown(kind="string, the name of an installed source (see below)")
    ] = Field(
        description="The broker adapter (a `fencebridge.sources` entry point): decides which "
        "further keys apply."
    )
    ack_mode: AckMode = Field(
        default=ACK_MODE_DEFAULT,
        description=_doc(
            """
            `after_inbox`: acknowledge once the delivery's work row has committed; the broker
            is only a wake-up signal and retries are the bridge's. `after_outcome`: hold the
            delivery, extend its visibility timeout (SQS) or ack deadline (Pub/Sub) while its
            work row makes progress, and acknowledge once the row is terminal or parked. In
            both modes nothing is acknowledged before the row has committed.
            """
        ),
    )
    wait_for_standby: StrictBool = Field(
        default=False,
        description=_doc(
            """
            Acknowledge a batch, and make a class D job type's call after its intent, only once
            a standby has flushed the commit (its WAL position compared with
            `pg_stat_replication`; the bridge's role needs `pg_read_all_stats`). With
            asynchronous replication this is what keeps a failover from losing a delivery
            the broker was told to delete, or a class D intent (operations.md, "Durability
            across a failover"). A wait that runs out acknowledges nothing (the broker
            redelivers) and calls nothing (the intent is withdrawn, the row retried).
            """
        ),
    )
    wait_for_standby_seconds: StrictFloat = Field(
        default=10.0,
        gt=0,
        le=600,
        description="The longest a `wait_for_standby` wait lasts before it gives up.",
    )
    mode: SubscriptionMode = Field(
        default=SubscriptionMode.LIVE,
        description=_doc(
            """
            `live`: deliveries become work rows and run. `shadow`: the subscription reads a
            copy of a stream another system still consumes (an SNS fan-out to a second SQS
            queue, a second Pub/Sub subscription on the topic), decodes and decides every
            delivery as the inbox does (new, replay, conflict, quarantined) and records it
            apart from the work rows: nothing is ever claimed, no handler is called, no target
            sees a request. `fencebridge shadow report` compares the record with the existing
            system's effect log. Read at start only: going live is a configuration change and
            a restart. A shadow subscription acknowledges after its record commits
            (`ack_mode = "after_inbox"`) and must not read the queue or subscription of a live
            one.
            """
        ),
    )
    max_body_bytes: StrictInt = Field(
        default=MAX_BODY_BYTES_DEFAULT,
        ge=1,
        le=10 * 1024**2,
        description=_doc(
            """
            Largest body accepted. A longer one is quarantined (`body_too_large`) before it is
            parsed.
            """
        ),
    )
    tenant_backlog_quota: Annotated[
        StrictInt | None, Shown(default="`[bridge] tenant_backlog_quota`")
    ] = Field(
        default=None,
        ge=1,
        le=BACKLOG_QUOTA_MAX,
        description=_doc(
            """
            The tenant backlog quota of this subscription's deliveries, in place of
            `[bridge] tenant_backlog_quota`. The backlog it is compared with is still the
            tenant's open rows of every subscription.
            """
        ),
    )
    job_types: Annotated[
        tuple[Name, ...], AfterValidator(distinct), Shown(kind="array of job type names, not empty")
    ] = Field(
        min_length=1,
        description=_doc(
            """
                The job types this subscription accepts; each needs its `[jobs.<name>]` table.
                A delivery that decodes to another job type is quarantined
                (`unknown_job_type`).
                """
        ),
    )
    schema_versions: Annotated[
        tuple[Identifier, ...],
        AfterValidator(distinct),
        Shown(kind="array of strings, 1..256 characters each"),
    ] = Field(
        default=(),
        description=_doc(
            """
            The schema versions this subscription accepts. Empty: no check. Otherwise
            `decode.schema_version` is required and other versions are quarantined
            (`unknown_schema_version`).
            """
        ),
    )
    decode: DecodeConfig = Field(
        description="The decoding rules, `[subscriptions.<name>.decode]`; keys listed below."
    )

    _settings: Any = PrivateAttr(default=None)
    _bridge_quota: int | None = PrivateAttr(default=None)

    @property
    def shadow(self) -> bool:
        return self.mode is SubscriptionMode.SHADOW

    @property
    def backlog_quota(self) -> int | None:
        """The tenant backlog quota of this subscription's deliveries: its own, or the
        bridge's (``None``: no quota)."""
        if self.tenant_backlog_quota is not None:
            return self.tenant_backlog_quota
        return self._bridge_quota

    def with_bridge_quota(self, quota: int | None) -> Self:
        """Attach ``[bridge] tenant_backlog_quota``, the default of every subscription."""
        self._bridge_quota = quota
        return self

    @property
    def settings(self) -> SourceSettings:
        """The adapter's keys of this subscription (its ``SourceSettings`` model)."""
        assert self._settings is not None, "a subscription is built with its adapter's settings"
        settings: SourceSettings = self._settings
        return settings

    def with_settings(self, settings: SourceSettings) -> Self:
        """Attach the adapter's keys, once both halves of the table have been validated."""
        self._settings = settings
        return self

    @model_validator(mode="after")
    def _across_keys(self, info: ValidationInfo) -> Self:
        found: list[tuple[tuple[str | int, ...], str]] = []
        if self.mode is SubscriptionMode.SHADOW and self.ack_mode is not AckMode.AFTER_INBOX:
            found.append(
                (
                    ("ack_mode",),
                    "a shadow subscription has no outcome to wait for: only 'after_inbox'",
                )
            )
        declared = (info.context or {}).get(DECLARED_JOBS)
        for position, job_type in enumerate(self.job_types):
            if declared is not None and job_type not in declared:
                found.append(
                    (
                        ("job_types", position),
                        f"no job type {job_type!r}; define it as [jobs.{job_type}]",
                    )
                )
        decode = self.decode
        message_id = decode.operation_id.kind is SourceKind.MESSAGE_ID
        if message_id and not decode.operation_id_from_message_id:
            found.append(
                (
                    ("decode", "operation_id"),
                    "'message_id' needs operation_id_from_message_id = true: a producer's "
                    "resend gets a new message id and would become a second operation",
                )
            )
        if decode.operation_id_from_message_id and not message_id:
            found.append(
                (
                    ("decode", "operation_id_from_message_id"),
                    f"is true, but operation_id is {str(decode.operation_id)!r}, not 'message_id'",
                )
            )
        decoded = decode.job_type
        if decoded.kind is SourceKind.VALUE and decoded.argument not in self.job_types:
            found.append(
                (
                    ("decode", "job_type"),
                    f"the constant {decoded.argument!r} is not one of job_types",
                )
            )
        version = decode.schema_version
        if self.schema_versions and version is None:
            found.append(
                (
                    ("decode", "schema_version"),
                    "required key is missing: schema_versions lists the accepted versions, so "
                    "the version must be decoded",
                )
            )
        if (
            version is not None
            and version.kind is SourceKind.VALUE
            and self.schema_versions
            and version.argument not in self.schema_versions
        ):
            found.append(
                (
                    ("decode", "schema_version"),
                    f"the constant {version.argument!r} is not one of schema_versions",
                )
            )
        if found:
            raise invalid_all(found)
        return self


class RetentionConfig(Table):
    """How long finished work is kept and who answers for deleting it. Optional for running
    the bridge; `fencebridge check` reports no-go without it. `fencebridge purge --config`
    reads the age from here; rows parked as `unknown` or `quarantined` are never purged.
    """

    purge_after_days: StrictInt = Field(
        ge=1,
        le=36500,
        description=_doc(
            """
            Age (since settlement) after which succeeded and failed rows, their payloads and
            resolved rejected deliveries are purged. A delivery redelivered after its row was
            purged is a new operation, so this must be longer than the broker can redeliver
            (SQS keeps messages up to 14 days, Pub/Sub topic retention up to 31);
            `fencebridge check` enforces it per job type.
            """
        ),
    )
    erasure_owner: Identifier = Field(
        description=_doc(
            """
            Who owns retention and erasure requests for work rows and payloads (a team or
            role): the owner of `fencebridge erase --tenant` and of this plan.
            """
        )
    )
    tombstone_days: StrictInt = Field(
        default=TOMBSTONE_DAYS_DEFAULT,
        ge=1,
        le=36500,
        description=_doc(
            """
            Age (since the erasure) after which `fencebridge purge` removes an erased
            operation's tombstone (keyed hashes, payload hash, state: no identifier, no
            payload). Until then a redelivery of the operation is a replay or a conflict, never
            new work, so this must be longer than the broker can redeliver (SQS keeps messages
            up to 14 days, Pub/Sub up to 31); `fencebridge check` reports a shorter horizon as
            no-go.
            """
        ),
    )


OUTBOX_BATCH_DEFAULT: Final = 10
OUTBOX_LEASE_SECONDS_DEFAULT: Final = 60.0
OUTBOX_POLL_SECONDS_DEFAULT: Final = 1.0
OUTBOX_MAX_ATTEMPTS_DEFAULT: Final = 10
OUTBOX_SEND_TRIES_DEFAULT: Final = 3
OUTBOX_RETRY_INITIAL_SECONDS_DEFAULT: Final = 0.2
OUTBOX_RETRY_MAX_SECONDS_DEFAULT: Final = 5.0


class SinkSettings(Table):
    """A sink's keys of a destination table, beside the core's. Its docstring opens the
    sink's section of the reference (with the form of its `address`); each field's description
    documents its key. The base class has none: a sink that needs no key of its own uses it."""

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        """What is wrong with ``address`` for this sink (None: nothing it can tell before it
        sends): checked as the file is read, so a destination that could never send is an
        error at start, not at its first message."""
        return None

    @classmethod
    def of(cls, destination: DestinationConfig) -> Self:
        """The destination's settings, if they are this sink's (guards direct use)."""
        if not isinstance(destination.settings, cls):
            raise ConfigError(
                f"outbox.{destination.name}: sink {destination.sink!r} is not sent by "
                f"{cls.__name__}"
            )
        return destination.settings


class DestinationConfig(Table):
    """One outbox destination, `[outbox.<name>]`: where `ctx.outbox.publish("<name>", ...)`
    messages go. `fencebridge run` relays each destination's committed messages, one relay per
    destination at a time across every process (a lease and a fence in the database).
    `sink` names the sink, which owns the rest of the table's keys: they are listed under the
    sink below, and a key of another sink is an error. Credentials come from the environment of
    the sink's client library, never from the file.
    """

    sink: Identifier = Field(
        description=_doc(
            """
            The sink that sends this destination's messages, by its `fencebridge.sinks` entry
            point: decides which further keys apply, and the form of `address`.
            """
        )
    )
    address: Identifier = Field(
        description=_doc(
            """
            The sink's target (a queue URL, a topic), in the form its sink's section below
            gives.
            """
        )
    )
    batch: StrictInt = Field(
        default=OUTBOX_BATCH_DEFAULT,
        ge=1,
        le=1000,
        description="Messages the relay reads and sends per round (SQS sends 10 per call).",
    )
    lease_seconds: StrictFloat = Field(
        default=OUTBOX_LEASE_SECONDS_DEFAULT,
        ge=1,
        le=3600,
        description=_doc(
            """
            The relay lease: renewed every round; a process that stops renewing (paused,
            partitioned, killed) is taken over once it runs out, under a higher fence, and its
            late marks are refused. Keep it above the longest round (a send call's tries and
            backoff; a Pub/Sub publish waits up to 30 s): a round that outlives it is taken
            over while it sends, and its messages are sent twice, with the same ids.
            """
        ),
    )
    poll_interval_seconds: StrictFloat = Field(
        default=OUTBOX_POLL_SECONDS_DEFAULT,
        gt=0,
        le=3600,
        description="Pause between rounds while the destination has nothing pending.",
    )
    max_attempts: StrictInt = Field(
        default=OUTBOX_MAX_ATTEMPTS_DEFAULT,
        ge=1,
        le=1000,
        description=_doc(
            """
            Sends of one message the sink may refuse before it is parked with the reason
            (a message the sink refuses as invalid is parked at once).
            """
        ),
    )
    send_tries: StrictInt = Field(
        default=OUTBOX_SEND_TRIES_DEFAULT,
        ge=1,
        le=100,
        description=_doc(
            """
            Tries of a send call that fails as a whole (connection refused or cut, throttled,
            a 5xx) within one round, with exponential backoff and jitter; past them the round
            fails and the relay restarts after the supervisor's backoff. Such failures do not
            count against `max_attempts`.
            """
        ),
    )
    retry_initial_seconds: StrictFloat = Field(
        default=OUTBOX_RETRY_INITIAL_SECONDS_DEFAULT,
        gt=0,
        le=3600,
        description="First backoff between tries of a failed send call.",
    )
    retry_max_seconds: StrictFloat = Field(
        default=OUTBOX_RETRY_MAX_SECONDS_DEFAULT,
        gt=0,
        le=3600,
        description="Longest backoff between tries of a failed send call.",
    )

    _settings: Any = PrivateAttr(default=None)

    @property
    def settings(self) -> SinkSettings:
        """The sink's keys of this destination (its ``SinkSettings`` model)."""
        assert self._settings is not None, "a destination is built with its sink's settings"
        settings: SinkSettings = self._settings
        return settings

    def with_settings(self, settings: SinkSettings) -> Self:
        """Attach the sink's keys, once both halves of the table have been validated."""
        self._settings = settings
        return self

    @model_validator(mode="after")
    def _ordered_backoff(self) -> Self:
        if self.retry_initial_seconds > self.retry_max_seconds:
            raise invalid(
                f"must not be above retry_max_seconds ({_number(self.retry_max_seconds)})",
                key=("retry_initial_seconds",),
            )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeConfig:
    """The whole file: process settings, job types and subscriptions, checked together."""

    bridge: BridgeSettings
    jobs: Mapping[str, JobConfig]
    subscriptions: Mapping[str, SubscriptionConfig]
    retention: RetentionConfig | None = None
    #: outbox destinations by name (``[outbox.<name>]``)
    outbox: Mapping[str, DestinationConfig] = field(default_factory=dict)
    #: the file it was read from, for messages about it
    file: str = "<config>"

    def concurrency_limits(self) -> dict[str, ConcurrencyLimit]:
        """The job types with a concurrency limit, as the store's claims take them."""
        return {
            name: job.concurrency_limit
            for name, job in self.jobs.items()
            if job.concurrency_limit.limited
        }

    def token_rates(self) -> dict[str, TokenRate]:
        """The job types with a token rate, as the store's claims take them."""
        return {name: job.token_rate for name, job in self.jobs.items() if job.token_rate.limited}

    def decode_rules(self, subscription: str) -> DecodeRules:
        """The subscription's decoding rules, joined with the job types it accepts."""
        sub = self.subscriptions[subscription]
        return DecodeRules(
            subscription=sub.name,
            tenant_id=sub.decode.tenant_id,
            operation_id=sub.decode.operation_id,
            job_type=sub.decode.job_type,
            schema_version=sub.decode.schema_version,
            payload=sub.decode.payload,
            jobs={
                t: JobRule(
                    self.jobs[t].target_class, self.jobs[t].max_attempts, self.jobs[t].priority
                )
                for t in sub.job_types
            },
            schema_versions=frozenset(sub.schema_versions),
            max_body_bytes=sub.max_body_bytes,
            priority=sub.decode.priority,
        )
