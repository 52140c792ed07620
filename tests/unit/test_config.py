"""The configuration file: the example loads, every rule has its own message, docs match."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge import config
from bridge.config import (
    AckMode,
    BridgeConfig,
    load_config,
    parse_config,
    read_destination,
    reference_markdown,
)
from bridge.errors import ConfigError
from bridge.ingest.decode import FieldSource, PayloadSource, SourceKind
from bridge.types import TargetClass
from consumers.pubsub.source import FlowControl, PubSubSettings
from consumers.sns.sink import SnsSinkSettings
from consumers.sqs import source as sqs
from consumers.sqs.sink import SqsSinkSettings
from consumers.sqs.source import SqsSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "bridge.toml"
REFERENCE = ROOT / "docs" / "configuration.md"

# The smallest valid file; each invalid case below changes one thing in it.
BASE = """\
[jobs.refund]
handler = "app.refunds:handler"
target_class = "C"

[subscriptions.refunds]
source = "sqs"
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/refunds"
job_types = ["refund"]

[subscriptions.refunds.decode]
tenant_id = "attribute:tenant_id"
operation_id = "body:/refund_request_id"
job_type = "value:refund"
"""

PUBSUB = """\
[jobs.sms]
handler = "app.notify:send_sms"
target_class = "D"

[subscriptions.sms]
source = "pubsub"
subscription = "projects/p/subscriptions/sms"
job_types = ["sms"]

[subscriptions.sms.decode]
tenant_id = "value:acme"
operation_id = "attribute:key"
job_type = "value:sms"
"""


def edit(text: str, old: str, new: str) -> str:
    assert old in text, f"test setup: {old!r} is not in the base file"
    return text.replace(old, new, 1)


def after(text: str, header: str, line: str) -> str:
    """Add ``line`` right below the section ``header``."""
    return edit(text, f"{header}\n", f"{header}\n{line}\n")


def message(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="bridge.toml")
    return str(caught.value)


# -- valid files ----------------------------------------------------------------------------


def test_the_example_loads_with_what_it_says() -> None:
    loaded = load_config(EXAMPLE)
    assert loaded.file == str(EXAMPLE)
    assert loaded.bridge.worker_id == "bridge-1"
    assert set(loaded.jobs) == {"refund", "ledger_entry", "sms"}
    assert loaded.jobs["sms"].target_class is TargetClass.D
    assert loaded.jobs["sms"].max_attempts == 1
    refunds, sms = loaded.subscriptions["refunds"], loaded.subscriptions["sms"]
    assert refunds.source == "sqs"
    assert SqsSettings.of(refunds).region == "eu-west-1"
    assert refunds.job_types == ("refund", "ledger_entry")
    assert refunds.decode.payload == PayloadSource("/refund")
    assert refunds.decode.operation_id == FieldSource(SourceKind.BODY, "/refund_request_id")
    assert sms.source == "pubsub"
    assert PubSubSettings.of(sms).subscription == "projects/acme-prod/subscriptions/sms-requests"
    assert PubSubSettings.of(sms).flow_control.max_bytes == 104857600
    assert sms.decode.tenant_id == FieldSource(SourceKind.VALUE, "acme")
    assert set(loaded.outbox) == {"ledger_events"}
    assert loaded.outbox["ledger_events"].sink == "sqs"


def test_the_example_mentions_every_key() -> None:
    text = EXAMPLE.read_text()
    sections = (
        config.BridgeSettings,
        config.JobConfig,
        config.SubscriptionConfig,
        SqsSettings,
        PubSubSettings,
        FlowControl,
        config.DecodeConfig,
        config.DestinationConfig,
    )
    keys = {name for cls in sections for name in cls.model_fields}
    # Set (or shown commented out) as `key = `, inside an inline table, or as a section `[...key]`.
    pattern = r"(?:^# ?|^|[{{,] ){0} = |\.{0}\]$"
    missing = {k for k in keys if not re.search(pattern.format(k), text, re.MULTILINE)}
    assert missing == set()


def test_defaults_fill_what_the_file_leaves_out() -> None:
    loaded = parse_config(BASE)
    job = loaded.jobs["refund"]
    sub = loaded.subscriptions["refunds"]
    queue = SqsSettings.of(sub)
    assert loaded.bridge.worker_threads == config.WORKER_THREADS_DEFAULT
    assert loaded.bridge.prefetch == config.PREFETCH_DEFAULT == 0
    assert loaded.bridge.health_port == config.HEALTH_PORT_DEFAULT
    assert re.fullmatch(r".+-\d+", loaded.bridge.worker_id)
    assert job.max_attempts == config.MAX_ATTEMPTS_DEFAULT
    assert job.lease_seconds == config.LEASE_SECONDS_DEFAULT
    assert job.backoff_max_seconds == config.BACKOFF_MAX_SECONDS_DEFAULT
    assert job.rate_limit_wait_max_seconds == 900.0
    assert sub.ack_mode is AckMode.AFTER_INBOX
    assert queue.receive_batch == sqs.RECEIVE_BATCH_DEFAULT
    assert queue.wait_seconds == sqs.WAIT_SECONDS_DEFAULT
    assert sub.max_body_bytes == config.MAX_BODY_BYTES_DEFAULT
    assert sub.schema_versions == ()
    assert queue.region is None
    assert sub.decode.payload == PayloadSource()
    assert sub.decode.schema_version is None
    assert sub.decode.operation_id_from_message_id is False


def test_class_d_defaults_to_one_attempt() -> None:
    loaded = parse_config(PUBSUB)
    assert loaded.jobs["sms"].max_attempts == config.MAX_ATTEMPTS_CLASS_D
    assert PubSubSettings.of(loaded.subscriptions["sms"]).flow_control == FlowControl()


def test_token_rates_are_read_with_their_default_bursts() -> None:
    cfg = parse_config(after(BASE, "[jobs.refund]", 'rate = "90/min"\nrate_per_tenant = " 1 / s "'))
    rate = cfg.jobs["refund"].token_rate
    assert (str(rate.total), str(rate.per_tenant)) == ("90/min", "1/s")
    # a burst defaults to one second of its rate, rounded up, and at least one run
    assert rate.buckets() == [90, 60_000_000, 2, 1, 1_000_000, 1]
    assert cfg.token_rates() == {"refund": rate}
    assert parse_config(BASE).token_rates() == {}


def test_integers_are_accepted_where_seconds_are_numbers() -> None:
    text = after(BASE, "[jobs.refund]", "lease_seconds = 90")
    assert parse_config(text).jobs["refund"].lease_seconds == 90.0


def test_message_id_is_accepted_with_the_opt_in() -> None:
    text = edit(BASE, '"body:/refund_request_id"', '"message_id"')
    text = after(text, "[subscriptions.refunds.decode]", "operation_id_from_message_id = true")
    decode = parse_config(text).subscriptions["refunds"].decode
    assert decode.operation_id == FieldSource(SourceKind.MESSAGE_ID)


def test_decode_rules_join_the_job_table() -> None:
    rules = load_config(EXAMPLE).decode_rules("refunds")
    assert rules.subscription == "refunds"
    assert set(rules.jobs) == {"refund", "ledger_entry"}
    assert rules.jobs["ledger_entry"].target_class is TargetClass.A
    assert rules.schema_versions == frozenset({"1", "2"})
    assert rules.max_body_bytes == 262144


# -- one message per rule -------------------------------------------------------------------

INVALID = [
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', '"tenant"'),
        "subscriptions.refunds.decode.tenant_id: expected 'attribute:NAME', "
        "'body:/json/pointer' or 'value:TEXT', got 'tenant'",
        id="unknown-field-source",
    ),
    pytest.param(
        edit(BASE, "job_types =", "job_typs ="),
        "subscriptions.refunds.job_typs: unknown key; did you mean 'job_types'?",
        id="typo-in-key",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "colour = 1"),
        "jobs.refund.colour: unknown key; expected one of: handler, target_class, "
        "max_attempts, lease_seconds, backoff_initial_seconds, backoff_max_seconds, "
        "rate_limit_wait_max_seconds, concurrency, concurrency_per_tenant, rate, burst, "
        "rate_per_tenant, burst_per_tenant, priority, owner",
        id="unknown-key",
    ),
    pytest.param(
        "[brige]\n" + BASE,
        "brige: unknown section; did you mean 'bridge'?",
        id="unknown-section",
    ),
    pytest.param(
        "[queues]\n" + BASE,
        "queues: unknown section; expected [bridge], [jobs.<name>] or [subscriptions.<name>]",
        id="unknown-section-no-suggestion",
    ),
    pytest.param(
        'database_url = "postgresql://u:pw@h/db"\n' + BASE,
        "database_url: secrets are never read from the configuration file; remove this key "
        "and set FENCEBRIDGE_DATABASE_URL in the environment",
        id="database-url-top-level",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds.decode]", 'database_url = "postgresql://x"'),
        "subscriptions.refunds.decode.database_url: secrets are never read from the "
        "configuration file; remove this key and set FENCEBRIDGE_DATABASE_URL in the environment",
        id="database-url-nested",
    ),
    pytest.param(
        "[bridge]\nDATABASE_URL = 1\n" + BASE,
        "bridge.DATABASE_URL: secrets are never read from the configuration file; remove this "
        "key and set FENCEBRIDGE_DATABASE_URL in the environment",
        id="database-url-any-case",
    ),
    pytest.param(
        "[bridge]\nworker_threads = 0\n" + BASE,
        "bridge.worker_threads: must be from 1 to 256, got 0",
        id="integer-range",
    ),
    pytest.param(
        "[bridge]\nworker_threads = 2.5\n" + BASE,
        "bridge.worker_threads: expected an integer, got 2.5",
        id="integer-type",
    ),
    pytest.param(
        "[bridge]\nworker_threads = true\n" + BASE,
        "bridge.worker_threads: expected an integer, got true",
        id="boolean-is-not-an-integer",
    ),
    pytest.param(
        "[bridge]\nprefetch = -1\n" + BASE,
        "bridge.prefetch: must be from 0 to 1000, got -1",
        id="prefetch-range",
    ),
    pytest.param(
        "[bridge]\npoll_interval_seconds = 0\n" + BASE,
        "bridge.poll_interval_seconds: must be more than 0 to 3600, got 0",
        id="positive-duration",
    ),
    pytest.param(
        "[bridge]\nsweep_interval_seconds = nan\n" + BASE,
        "bridge.sweep_interval_seconds: must be more than 0 to 3600, got nan",
        id="not-a-number",
    ),
    pytest.param(
        '[bridge]\npoll_interval_seconds = "1s"\n' + BASE,
        "bridge.poll_interval_seconds: expected a number, got '1s'",
        id="number-type",
    ),
    pytest.param(
        '[bridge]\nworker_id = ""\n' + BASE,
        "bridge.worker_id: must not be empty",
        id="empty-worker-id",
    ),
    pytest.param(
        '[bridge]\nworker_id = "a\\u0000b"\n' + BASE,
        "bridge.worker_id: the value contains a NUL character",
        id="nul-in-worker-id",
    ),
    pytest.param(
        '[bridge]\nhealth_host = "local host"\n' + BASE,
        "bridge.health_host: expected a host name or address, got 'local host'",
        id="health-host",
    ),
    pytest.param(
        "[bridge]\nhealth_port = 70000\n" + BASE,
        "bridge.health_port: must be from 0 to 65535, got 70000",
        id="health-port",
    ),
    pytest.param(
        "bridge = 3\n" + BASE,
        "bridge: expected a table, got 3",
        id="section-not-a-table",
    ),
    pytest.param(
        BASE.split("[subscriptions.refunds]", maxsplit=1)[0],
        "subscriptions: at least one subscription is required, as [subscriptions.<name>]",
        id="no-subscription",
    ),
    pytest.param(
        BASE.replace('[jobs.refund]\nhandler = "app.refunds:handler"\ntarget_class = "C"\n', ""),
        "jobs: at least one job type is required, as [jobs.<name>]",
        id="no-job",
    ),
    pytest.param(
        edit(BASE, "[jobs.refund]", '[jobs."re fund"]'),
        "jobs.\"re fund\": a job type name is 1 to 64 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit\n"
        "bridge.toml: subscriptions.refunds.job_types[0]: no job type 'refund'; "
        "define it as [jobs.refund]",
        id="job-name",
    ),
    pytest.param(
        edit(BASE, "[subscriptions.refunds]", '[subscriptions."-x"]').replace(
            "[subscriptions.refunds.decode]", '[subscriptions."-x".decode]'
        ),
        "subscriptions.-x: a subscription name is 1 to 64 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit",
        id="subscription-name",
    ),
    pytest.param(
        edit(BASE, 'handler = "app.refunds:handler"\n', ""),
        "jobs.refund.handler: required key is missing",
        id="handler-required",
    ),
    pytest.param(
        edit(BASE, '"app.refunds:handler"', '"app.refunds.handler"'),
        "jobs.refund.handler: expected an import path 'module.path:attribute', "
        "got 'app.refunds.handler'",
        id="handler-syntax",
    ),
    pytest.param(
        edit(BASE, '"app.refunds:handler"', '"app.class:handler"'),
        "jobs.refund.handler: expected an import path 'module.path:attribute', "
        "got 'app.class:handler'",
        id="handler-keyword",
    ),
    pytest.param(
        edit(BASE, 'target_class = "C"\n', ""),
        "jobs.refund.target_class: required key is missing",
        id="target-class-required",
    ),
    pytest.param(
        edit(BASE, 'target_class = "C"', 'target_class = "E"'),
        "jobs.refund.target_class: expected 'A', 'B', 'C' or 'D', got 'E'",
        id="target-class-choice",
    ),
    pytest.param(
        after(
            edit(BASE, 'target_class = "C"', 'target_class = "D"'),
            "[jobs.refund]",
            "max_attempts = 3",
        ),
        "jobs.refund.max_attempts: class D (no fence, no idempotency key) allows one attempt "
        "only; set 1 or leave it out, got 3",
        id="class-d-one-attempt",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "max_attempts = 0"),
        "jobs.refund.max_attempts: must be from 1 to 100, got 0",
        id="max-attempts-range",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "backoff_initial_seconds = 10\nbackoff_max_seconds = 5"),
        "jobs.refund.backoff_max_seconds: must be at least backoff_initial_seconds (10), got 5",
        id="backoff-order",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "concurrency = 0"),
        "jobs.refund.concurrency: must be from 1 to 100000, got 0",
        id="concurrency-range",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "concurrency = 2\nconcurrency_per_tenant = 3"),
        "jobs.refund.concurrency_per_tenant: must be at most concurrency (2), the limit of the "
        "whole job type, got 3",
        id="concurrency-per-tenant-within-the-job-type",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", 'rate = "fast"'),
        "jobs.refund.rate: expected a whole number of runs per second, minute or hour, such as "
        '"50/s", "600/min" or "1000/h", got \'fast\'',
        id="rate-spelling",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", 'rate = "2.5/s"'),
        "jobs.refund.rate: expected a whole number of runs per second, minute or hour, such as "
        '"50/s", "600/min" or "1000/h", got \'2.5/s\'',
        id="rate-whole-runs",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "rate = 50"),
        'jobs.refund.rate: expected a string such as "50/s", "600/min" or "1000/h" (runs per '
        "second, minute or hour), got 50",
        id="rate-not-a-number",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", 'rate = "0/s"'),
        "jobs.refund.rate: a rate's count is from 1 to 1000000, not 0",
        id="rate-zero",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "burst = 5"),
        "jobs.refund.burst: a burst needs its rate: set rate too, or leave the burst out",
        id="burst-without-rate",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", 'rate = "5/s"\nburst = 0'),
        "jobs.refund.burst: must be from 1 to 1000000, got 0",
        id="burst-range",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", "burst_per_tenant = 2"),
        "jobs.refund.burst_per_tenant: a burst needs its rate: set rate_per_tenant too, or "
        "leave the burst out",
        id="tenant-burst-without-rate",
    ),
    pytest.param(
        after(BASE, "[jobs.refund]", 'rate = "60/min"\nrate_per_tenant = "2/s"'),
        "jobs.refund.rate_per_tenant: must be at most rate (60/min), the rate of the whole "
        "job type, got 2/s",
        id="tenant-rate-within-the-job-type",
    ),
    pytest.param(
        after(
            BASE, "[jobs.refund]", 'rate = "10/s"\nrate_per_tenant = "5/s"\nburst_per_tenant = 20'
        ),
        "jobs.refund.burst_per_tenant: must be at most burst (10, one second of rate), the burst "
        "of the whole job type, got 20",
        id="tenant-burst-within-the-job-type",
    ),
    pytest.param(
        edit(BASE, 'source = "sqs"\n', ""),
        "subscriptions.refunds.source: required key is missing; expected 'pubsub' or 'sqs'",
        id="source-required",
    ),
    pytest.param(
        edit(BASE, 'source = "sqs"', 'source = "kafka"'),
        "subscriptions.refunds.source: expected 'pubsub' or 'sqs', got 'kafka'",
        id="source-choice",
    ),
    pytest.param(
        edit(BASE, 'queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/refunds"\n', ""),
        "subscriptions.refunds.queue_url: required for source = 'sqs'",
        id="queue-url-required",
    ),
    pytest.param(
        edit(BASE, '"https://sqs.eu-west-1.amazonaws.com/123456789012/refunds"', '"sqs/refunds"'),
        "subscriptions.refunds.queue_url: expected an http:// or https:// URL, got 'sqs/refunds'",
        id="queue-url-syntax",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'endpoint_url = "ftp://localhost"'),
        "subscriptions.refunds.endpoint_url: expected an http:// or https:// URL, "
        "got 'ftp://localhost'",
        id="endpoint-url-syntax",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'region = "EU West"'),
        "subscriptions.refunds.region: expected an AWS region such as 'eu-west-1', got 'EU West'",
        id="region-syntax",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'subscription = "projects/p/subscriptions/s"'),
        "subscriptions.refunds.subscription: applies to source = 'pubsub' only, and this "
        "subscription's source is 'sqs'",
        id="pubsub-key-on-sqs",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "flow_control = { max_messages = 10 }"),
        "subscriptions.refunds.flow_control: applies to source = 'pubsub' only, and this "
        "subscription's source is 'sqs'",
        id="flow-control-on-sqs",
    ),
    pytest.param(
        after(PUBSUB, "[subscriptions.sms]", "receive_batch = 5"),
        "subscriptions.sms.receive_batch: applies to source = 'sqs' only, and this "
        "subscription's source is 'pubsub'",
        id="sqs-key-on-pubsub",
    ),
    pytest.param(
        edit(PUBSUB, 'subscription = "projects/p/subscriptions/sms"\n', ""),
        "subscriptions.sms.subscription: required for source = 'pubsub'",
        id="pubsub-subscription-required",
    ),
    pytest.param(
        edit(PUBSUB, '"projects/p/subscriptions/sms"', '"sms"'),
        "subscriptions.sms.subscription: expected 'projects/<project>/subscriptions/<id>', "
        "got 'sms'",
        id="pubsub-subscription-syntax",
    ),
    pytest.param(
        after(PUBSUB, "[subscriptions.sms]", "flow_control = { max_mesages = 10 }"),
        "subscriptions.sms.flow_control.max_mesages: unknown key; did you mean 'max_messages'?",
        id="flow-control-typo",
    ),
    pytest.param(
        after(PUBSUB, "[subscriptions.sms]", "flow_control = { max_bytes = 10 }"),
        "subscriptions.sms.flow_control.max_bytes: must be from 1024 to 10737418240, got 10",
        id="flow-control-range",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'ack_mode = "after_commit"'),
        "subscriptions.refunds.ack_mode: expected 'after_inbox' or 'after_outcome', "
        "got 'after_commit'",
        id="ack-mode",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "receive_batch = 11"),
        "subscriptions.refunds.receive_batch: must be from 1 to 10, got 11",
        id="receive-batch",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "wait_seconds = 21"),
        "subscriptions.refunds.wait_seconds: must be from 0 to 20, got 21",
        id="wait-seconds",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "visibility_timeout_seconds = 0"),
        "subscriptions.refunds.visibility_timeout_seconds: must be from 1 to 43200, got 0",
        id="visibility-timeout",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "max_body_bytes = 0"),
        "subscriptions.refunds.max_body_bytes: must be from 1 to 10485760, got 0",
        id="max-body-bytes",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", "consumers = 0"),
        "subscriptions.refunds.consumers: must be from 1 to 64, got 0",
        id="consumers",
    ),
    pytest.param(
        edit(BASE, 'job_types = ["refund"]', "job_types = []"),
        "subscriptions.refunds.job_types: must list at least one",
        id="job-types-empty",
    ),
    pytest.param(
        edit(BASE, 'job_types = ["refund"]', 'job_types = "refund"'),
        "subscriptions.refunds.job_types: expected an array of strings, got 'refund'",
        id="job-types-type",
    ),
    pytest.param(
        edit(BASE, 'job_types = ["refund"]', 'job_types = ["refund", "payout"]'),
        "subscriptions.refunds.job_types[1]: no job type 'payout'; define it as [jobs.payout]",
        id="job-type-undefined",
    ),
    pytest.param(
        edit(BASE, 'job_types = ["refund"]', 'job_types = ["refund", "refund"]'),
        "subscriptions.refunds.job_types[1]: 'refund' is listed twice",
        id="job-type-twice",
    ),
    pytest.param(
        edit(BASE, 'job_types = ["refund"]', 'job_types = ["refund", 7]'),
        "subscriptions.refunds.job_types[1]: expected a string, got 7",
        id="job-type-not-a-string",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'schema_versions = ["1"]'),
        "subscriptions.refunds.decode.schema_version: required key is missing: "
        "schema_versions lists the accepted versions, so the version must be decoded",
        id="schema-versions-need-a-source",
    ),
    pytest.param(
        after(
            after(BASE, "[subscriptions.refunds]", 'schema_versions = ["1"]'),
            "[subscriptions.refunds.decode]",
            'schema_version = "value:2"',
        ),
        "subscriptions.refunds.decode.schema_version: the constant '2' is not one of "
        "schema_versions",
        id="schema-version-constant-not-accepted",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds]", 'schema_versions = [" 1"]'),
        "subscriptions.refunds.schema_versions[0]: the value has leading or trailing whitespace",
        id="schema-version-text",
    ),
    pytest.param(
        BASE.split("[subscriptions.refunds.decode]", maxsplit=1)[0],
        "subscriptions.refunds.decode: required key is missing",
        id="decode-required",
    ),
    pytest.param(
        edit(BASE, 'tenant_id = "attribute:tenant_id"\n', ""),
        "subscriptions.refunds.decode.tenant_id: required key is missing",
        id="tenant-id-required",
    ),
    pytest.param(
        edit(BASE, 'operation_id = "body:/refund_request_id"\n', ""),
        "subscriptions.refunds.decode.operation_id: required key is missing",
        id="operation-id-required",
    ),
    pytest.param(
        edit(BASE, '"body:/refund_request_id"', '"value:r-1"'),
        "subscriptions.refunds.decode.operation_id: a constant operation id would make every "
        "delivery one operation; expected 'attribute:NAME' or 'body:/json/pointer'",
        id="operation-id-constant",
    ),
    pytest.param(
        edit(BASE, '"body:/refund_request_id"', '"message_id"'),
        "subscriptions.refunds.decode.operation_id: 'message_id' needs "
        "operation_id_from_message_id = true: a producer's resend gets a new message id and "
        "would become a second operation",
        id="message-id-without-opt-in",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds.decode]", "operation_id_from_message_id = true"),
        "subscriptions.refunds.decode.operation_id_from_message_id: is true, but operation_id "
        "is 'body:/refund_request_id', not 'message_id'",
        id="opt-in-without-message-id",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds.decode]", 'operation_id_from_message_id = "yes"'),
        "subscriptions.refunds.decode.operation_id_from_message_id: expected true or false, "
        "got 'yes'",
        id="boolean-type",
    ),
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', '"message_id"'),
        "subscriptions.refunds.decode.tenant_id: 'message_id' is a source for operation_id "
        "only; expected 'attribute:NAME', 'body:/json/pointer' or 'value:TEXT'",
        id="message-id-for-tenant",
    ),
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', '"attribute:"'),
        "subscriptions.refunds.decode.tenant_id: the attribute name is empty, in 'attribute:'",
        id="attribute-name-empty",
    ),
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', '"attribute:a\\u0000"'),
        "subscriptions.refunds.decode.tenant_id: the attribute name contains a control "
        "character or a lone surrogate, in 'attribute:a\\x00'",
        id="attribute-name-control",
    ),
    pytest.param(
        edit(BASE, '"body:/refund_request_id"', '"body:refund_request_id"'),
        "subscriptions.refunds.decode.operation_id: a JSON pointer is empty or starts with '/', "
        "in 'body:refund_request_id'",
        id="pointer-without-slash",
    ),
    pytest.param(
        edit(BASE, '"body:/refund_request_id"', '"body:/a~2b"'),
        "subscriptions.refunds.decode.operation_id: in a JSON pointer '~' must be followed by "
        "'0' or '1', in 'body:/a~2b'",
        id="pointer-bad-escape",
    ),
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', '"value: acme"'),
        "subscriptions.refunds.decode.tenant_id: the constant has leading or trailing "
        "whitespace, in 'value: acme'",
        id="constant-whitespace",
    ),
    pytest.param(
        edit(BASE, '"attribute:tenant_id"', "42"),
        "subscriptions.refunds.decode.tenant_id: expected 'attribute:NAME', "
        "'body:/json/pointer' or 'value:TEXT', got 42",
        id="field-source-type",
    ),
    pytest.param(
        edit(BASE, '"value:refund"', '"value:payout"'),
        "subscriptions.refunds.decode.job_type: the constant 'payout' is not one of job_types",
        id="job-type-constant-not-accepted",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds.decode]", 'payload = "json"'),
        "subscriptions.refunds.decode.payload: expected 'body' or 'body:/json/pointer', got 'json'",
        id="payload-source",
    ),
    pytest.param(
        after(BASE, "[subscriptions.refunds.decode]", 'payload = "body:refund"'),
        "subscriptions.refunds.decode.payload: a JSON pointer is empty or starts with '/', "
        "in 'body:refund'",
        id="payload-pointer",
    ),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_each_invalid_file_names_the_key_and_the_problem(text: str, expected: str) -> None:
    assert message(text) == f"bridge.toml: {expected}"


def test_every_problem_is_reported_at_once() -> None:
    text = "[bridge]\ndatabase_url = 'postgresql://u:hunter2@db/x'\n\n" + BASE
    text = after(text, "[jobs.refund]", "max_attempt = 3")
    text = edit(text, 'tenant_id = "attribute:tenant_id"', 'tenant_id = "tenant"')
    lines = message(text).splitlines()
    assert lines == [
        "bridge.toml: bridge.database_url: secrets are never read from the configuration file; "
        "remove this key and set FENCEBRIDGE_DATABASE_URL in the environment",
        "bridge.toml: jobs.refund.max_attempt: unknown key; did you mean 'max_attempts'?",
        "bridge.toml: subscriptions.refunds.decode.tenant_id: expected 'attribute:NAME', "
        "'body:/json/pointer' or 'value:TEXT', got 'tenant'",
    ]
    assert "hunter2" not in message(text)


def test_checks_across_keys_are_all_reported() -> None:
    text = edit(BASE, 'job_types = ["refund"]', 'job_types = ["refund", "payout", "fee"]')
    assert message(text).splitlines() == [
        "bridge.toml: subscriptions.refunds.job_types[1]: no job type 'payout'; "
        "define it as [jobs.payout]",
        "bridge.toml: subscriptions.refunds.job_types[2]: no job type 'fee'; "
        "define it as [jobs.fee]",
    ]


def test_invalid_toml_names_the_file_and_the_position() -> None:
    # The parser's own wording may change between Python versions; the frame may not.
    assert re.fullmatch(
        r"bridge\.toml: invalid TOML: .+ \(at line 1, column \d+\)", message("[bridge\n")
    )


def test_the_secret_is_not_repeated_in_the_error() -> None:
    text = after(BASE, "[subscriptions.refunds]", 'database_url = "postgresql://u:hunter2@h/db"')
    assert "hunter2" not in message(text)


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(edit(BASE, 'target_class = "C"', 'target_class = "X"'))
    with pytest.raises(ConfigError, match=r"^.+bridge\.toml: jobs\.refund\.target_class: "):
        load_config(path)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"absent\.toml: cannot be read: No such file"):
        load_config(path)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_bytes(b"[bridge]\nworker_id = '\xff'\n")
    with pytest.raises(ConfigError, match=r"bridge\.toml: is not UTF-8 text \(byte 22\)"):
        load_config(path)


def test_configuration_is_immutable() -> None:
    loaded = parse_config(BASE)
    with pytest.raises(ValidationError, match="frozen"):
        loaded.bridge.worker_threads = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        loaded.jobs["other"] = loaded.jobs["refund"]  # type: ignore[index]
    assert isinstance(loaded, BridgeConfig)


# -- the reference --------------------------------------------------------------------------


def test_docs_are_the_generated_reference() -> None:
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: regenerate it with "
        "`python -m bridge.config > docs/configuration.md`"
    )


def test_the_reference_documents_every_key_with_its_default() -> None:
    reference = reference_markdown()
    for cls in (config.BridgeSettings, config.JobConfig, config.SubscriptionConfig, SqsSettings):
        for name, info in cls.model_fields.items():
            entry = reference.split(f"### `{name}`\n\n", 1)[1].split("\n\n", 1)[0]
            if isinstance(info.default, int | float) and not isinstance(info.default, bool):
                assert f"`{info.default!r}`" in entry, name
    assert "default `5` (class `D`: `1`)" in reference
    assert "a producer that resends after\na timeout gets a new message id" in reference


# -- outbox destinations -------------------------------------------------------------------------

OUTBOX = """
[outbox.ledger_events]
sink = "sqs"
address = "https://sqs.eu-west-1.amazonaws.com/123456789012/ledger-events"
"""


def test_an_outbox_destination_takes_its_defaults() -> None:
    loaded = parse_config(BASE + OUTBOX, file="bridge.toml")
    destination = loaded.outbox["ledger_events"]
    assert (destination.sink, destination.batch, destination.max_attempts) == ("sqs", 10, 10)
    assert parse_config(BASE, file="bridge.toml").outbox == {}


def test_an_outbox_destination_names_a_sink_that_is_installed() -> None:
    text = message(BASE + OUTBOX.replace('sink = "sqs"', 'sink = "kafka"'))
    expected = "expected 'pubsub', 'sns' or 'sqs', got 'kafka'"
    assert f"bridge.toml: outbox.ledger_events.sink: {expected}" in text


def test_every_problem_of_outbox_destinations_is_reported_at_once() -> None:
    text = message(
        BASE
        + OUTBOX.replace('sink = "sqs"', 'sink = "sqs"\nretry_initial_seconds = 9.0')
        + '\n[outbox."bad name"]\nsink = "sqs"\naddress = "x"\n'
        + '\n[outbox.missing]\nsink = "sqs"\n'
    )
    assert "outbox.ledger_events.retry_initial_seconds: must not be above retry_max_seconds" in (
        text
    )
    assert 'outbox."bad name": an outbox destination name is' in text
    assert "outbox.missing.address" in text


def test_a_destination_takes_its_sinks_own_keys() -> None:
    text = OUTBOX + 'region = "eu-west-1"\nendpoint_url = "http://127.0.0.1:5000"\n'
    destination = parse_config(BASE + text, file="bridge.toml").outbox["ledger_events"]
    settings = SqsSinkSettings.of(destination)
    assert (settings.region, settings.endpoint_url) == ("eu-west-1", "http://127.0.0.1:5000")


def test_a_key_of_another_sink_says_which_sink_it_belongs_to() -> None:
    topic = 'sink = "pubsub"\naddress = "projects/p/topics/t"\nregion = "eu-west-1"\n'
    text = message(BASE + "\n[outbox.ledger_events]\n" + topic)
    assert (  # the first other installed sink that declares the key, by name
        "outbox.ledger_events.region: applies to sink = 'sns' only, and this destination's "
        "sink is 'pubsub'"
    ) in text
    typo = message(BASE + OUTBOX + 'regoin = "eu-west-1"\n')
    assert "outbox.ledger_events.regoin: unknown key; did you mean 'region'?" in typo


@pytest.mark.parametrize(
    ("sink", "address", "problem"),
    [
        ("sqs", "ledger-events", "an sqs destination's address is its queue URL"),
        ("sns", "https://sns.example", "an sns destination's address is a topic ARN"),
        ("pubsub", "ledger-events", "a pubsub destination's address is projects/"),
    ],
)
def test_a_destination_address_its_sink_cannot_send_to_is_an_error_when_read(
    sink: str, address: str, problem: str
) -> None:
    table = f'\n[outbox.ledger_events]\nsink = "{sink}"\naddress = "{address}"\n'
    assert f"outbox.ledger_events.address: {problem}" in message(BASE + table)


def test_a_destination_read_alone_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        read_destination("refunds", {"sink": "sqs", "address": "q", "batch": 0})
    assert "outbox.refunds.batch" in str(caught.value)
    good = read_destination("refunds", {"sink": "sns", "address": "arn:aws:sns:x"})
    assert isinstance(good.settings, SnsSinkSettings)
