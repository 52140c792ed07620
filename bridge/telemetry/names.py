"""Every span name, attribute key and metric name fencebridge emits, in one place.

Messaging attributes follow the OpenTelemetry messaging semantic conventions (still marked
"development" upstream: when they move, only this module changes). Tenant and operation
identifiers appear only as keyed hashes (see :mod:`bridge.identity`), never raw, and no payload
byte is ever an attribute, an event or a label.
"""

from __future__ import annotations

from typing import Final

INSTRUMENTATION_NAME: Final = "fencebridge"
#: the semantic conventions' version the names below follow, and its schema URL on every span
SEMCONV_VERSION: Final = "1.43.0"
SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# -- span names (format with the subscription or job type) --------------------------------------
SPAN_RECEIVE: Final = "receive {subscription}"
SPAN_INBOX_WRITE: Final = "inbox write {subscription}"
SPAN_PROCESS: Final = "process {subscription}"
SPAN_RECONCILE: Final = "reconcile {job_type}"
SPAN_ACK: Final = "ack {subscription}"

# -- messaging semantic conventions ---------------------------------------------------------------
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_DESTINATION: Final = "messaging.destination.name"
MESSAGING_SUBSCRIPTION: Final = "messaging.destination.subscription.name"
MESSAGING_MESSAGE_ID: Final = "messaging.message.id"
MESSAGING_BATCH_COUNT: Final = "messaging.batch.message_count"
DB_SYSTEM: Final = "db.system.name"
ERROR_TYPE: Final = "error.type"

SYSTEM_SQS: Final = "aws_sqs"
SYSTEM_PUBSUB: Final = "gcp_pubsub"

# -- fencebridge attributes ------------------------------------------------------------------------
TENANT_HASH: Final = "fencebridge.tenant.hash"
OPERATION_HASH: Final = "fencebridge.operation.hash"
JOB_TYPE: Final = "fencebridge.job_type"
TARGET_CLASS: Final = "fencebridge.target_class"
ATTEMPT: Final = "fencebridge.attempt"
FENCE: Final = "fencebridge.fence"
TAKEOVER: Final = "fencebridge.takeover"
OUTCOME: Final = "fencebridge.outcome"
OUTCOME_CODE: Final = "fencebridge.outcome.code"
DECISION: Final = "fencebridge.decision"
REASON: Final = "fencebridge.reason"
FINDING: Final = "fencebridge.reconcile.finding"
ACTION: Final = "fencebridge.action"
#: the wait a RateLimited asked for, in seconds, when it was cut to the job type's maximum
RATE_WAIT_ASKED: Final = "fencebridge.rate_limit.asked_seconds"

# -- span events -----------------------------------------------------------------------------------
EVENT_DECISION: Final = "dedupe decision"
EVENT_LEASE_LOST: Final = "lease lost"
EVENT_FENCED_OUT: Final = "stale write fenced out"
EVENT_RECONCILED: Final = "reconciled"
EVENT_PARKED_UNKNOWN: Final = "parked unknown"
EVENT_SETTLE_UNKNOWN: Final = "settlement outcome unknown"
EVENT_RATE_WAIT_CLAMPED: Final = "rate limit wait clamped"

# -- metrics ---------------------------------------------------------------------------------------
METRIC_DELIVERIES: Final = "fencebridge.deliveries"
METRIC_COMPLETIONS: Final = "fencebridge.completions"
METRIC_TAKEOVERS: Final = "fencebridge.takeovers"
METRIC_LEASE_LOST: Final = "fencebridge.lease_lost"
METRIC_FENCED_OUT: Final = "fencebridge.fenced_out"
METRIC_RECONCILIATIONS: Final = "fencebridge.reconciliations"
#: RateLimited waits longer than the job type's maximum, cut to it (label ``job_type``)
METRIC_RATE_WAIT_CLAMPED: Final = "fencebridge.rate_limit.clamped"
METRIC_INBOX_COMMIT: Final = "fencebridge.inbox.commit.duration"
METRIC_RECEIVE_TO_ACK: Final = "fencebridge.receive_to_ack.duration"
METRIC_STANDBY_WAIT: Final = "fencebridge.standby_wait.duration"
METRIC_CLAIM_TO_SETTLE: Final = "fencebridge.claim_to_settle.duration"
METRIC_STALLED: Final = "fencebridge.claims.stalled"
METRIC_OLDEST_UNKNOWN: Final = "fencebridge.unknown.oldest_age"
METRIC_QUARANTINED: Final = "fencebridge.quarantined"
METRIC_QUEUE_DEPTH: Final = "fencebridge.queue.depth"
#: due rows that cannot be claimed now, by why (label ``reason``: ``limit``, ``rate``)
METRIC_WAITING: Final = "fencebridge.queue.waiting"
METRIC_THREAD_RESTARTS: Final = "fencebridge.thread.restarts"
#: outbox messages committed and not sent yet, per destination (label ``destination``)
METRIC_OUTBOX_PENDING: Final = "fencebridge.outbox.pending"
#: age of the oldest unsent outbox message, per destination
METRIC_OUTBOX_OLDEST: Final = "fencebridge.outbox.oldest_pending_age"
#: outbox messages the relay gave up on, per destination
METRIC_OUTBOX_PARKED: Final = "fencebridge.outbox.parked"
#: what happened on a broker stream: acks confirmed / refused / unanswered, extensions, lost
#: broker leases, deliveries let go or handed back (label ``event``)
METRIC_STREAM_EVENTS: Final = "fencebridge.stream.events"

# metric label keys (never identifiers)
LABEL_SUBSCRIPTION: Final = "subscription"
LABEL_JOB_TYPE: Final = "job_type"
LABEL_DECISION: Final = "decision"
LABEL_OUTCOME: Final = "outcome"
LABEL_FINDING: Final = "finding"
LABEL_ACTION: Final = "action"
LABEL_KIND: Final = "kind"
#: a supervised service of the bridge (claimer, worker, heartbeater, sweeper, gauges, health)
LABEL_SERVICE: Final = "service"
LABEL_EVENT: Final = "event"
LABEL_REASON: Final = "reason"
LABEL_PURPOSE: Final = "purpose"
#: a tenant's keyed hash (the waiting gauge: a row per tenant that waits)
LABEL_TENANT_HASH: Final = "tenant_hash"
#: an outbox destination's name in the configuration (``[outbox.<name>]``)
LABEL_DESTINATION: Final = "destination"
