"""The producer helper: its messages are read back by the consumers' own conversion and decoder.

Each message goes through what the bridge does with a received one: ``consumers.sqs.source.to_raw``
on the dict SQS returns (attributes and body as sent), ``consumers.pubsub.source.to_raw`` on the
Pub/Sub client library's own ``Message``, then :func:`bridge.ingest.decode.decode` with the
subscription's rules from the example configuration. Over HTTP against moto:
``tests/integration/test_producer.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import queue
import re
from pathlib import Path
from typing import Any

import pytest
from google.cloud.pubsub_v1 import types as pubsub_types
from google.cloud.pubsub_v1.subscriber.message import Message
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from bridge.config import BridgeConfig, load_config, parse_config
from bridge.errors import ProducerError
from bridge.ingest.decode import FieldSource, decode
from bridge.producer import TRACEPARENT_ATTRIBUTE, Producer, SqsMessage
from bridge.types import Delivery
from consumers.pubsub import source as pubsub_consumer
from consumers.sqs import source as sqs_consumer

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "bridge.toml"
REFUND = {"amount": 1200, "currency": "eur", "reason": "damaged in transit"}

#: the layout of the README's plain-boto3 example and of the demo: identifiers in attributes
ATTRIBUTES = """
[jobs.refund]
handler = "app.refunds:handler"
target_class = "C"

[subscriptions.payments]
source = "sqs"
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo"
job_types = ["refund"]
schema_versions = ["1"]

[subscriptions.payments.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "attribute:job_type"
schema_version = "attribute:schema_version"
payload = "body"
"""


@pytest.fixture(scope="module")
def example() -> BridgeConfig:
    return load_config(EXAMPLE)


@pytest.fixture(scope="module")
def tracer() -> trace.Tracer:
    return TracerProvider().get_tracer("test-producer")


def received_sqs(message: SqsMessage) -> dict[str, Any]:
    """The message as ReceiveMessage returns it (attributes and body as sent)."""
    request = message.request()
    system: dict[str, str] = {"ApproximateReceiveCount": "1"}
    if "MessageGroupId" in request:
        system["MessageGroupId"] = request["MessageGroupId"]
    return {
        "MessageId": "5fea7756-0ea4-451a-a703-a558b933e274",
        "Body": request["MessageBody"],
        "MessageAttributes": request["MessageAttributes"],
        "Attributes": system,
    }


def received_pubsub(data: bytes, attributes: dict[str, str], ordering_key: str) -> Message:
    pb = pubsub_types.PubsubMessage(
        data=data, attributes=attributes, ordering_key=ordering_key, message_id="17"
    )._pb
    return Message(pb, "ack-1", 1, queue.Queue())


def traceparent_of(span: trace.Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_an_sqs_message_decodes_with_the_example_rules_and_carries_the_trace(
    example: BridgeConfig, tracer: trace.Tracer
) -> None:
    producer = Producer.for_subscription(example, "refunds")
    with tracer.start_as_current_span("refunds publish", kind=SpanKind.PRODUCER) as span:
        message = producer.sqs(
            tenant_id="acme",
            operation_id="refund-1042",
            job_type="refund",
            schema_version="2",
            payload=REFUND,
        )
    raw = sqs_consumer.to_raw("refunds", received_sqs(message))
    delivery = decode(example.decode_rules("refunds"), raw)
    assert isinstance(delivery, Delivery), delivery
    assert (delivery.tenant_id, delivery.operation_id) == ("acme", "refund-1042")
    assert (delivery.job_type, delivery.schema_version) == ("refund", "2")
    assert json.loads(delivery.payload) == REFUND
    assert delivery.trace_context == traceparent_of(span)
    # The layout is the rules': operation id and version in the body, tenant and job type as
    # attributes, nothing else.
    assert json.loads(message.body) == {
        "refund_request_id": "refund-1042",
        "schema_version": "2",
        "refund": REFUND,
    }
    assert set(message.attributes) == {"tenant_id", "job_type", TRACEPARENT_ATTRIBUTE}


def test_a_pubsub_message_decodes_with_the_example_rules_and_carries_the_trace(
    example: BridgeConfig, tracer: trace.Tracer
) -> None:
    producer = Producer.for_subscription(example, "sms")
    with tracer.start_as_current_span("sms publish", kind=SpanKind.PRODUCER) as span:
        # The subscription carries one tenant and one job type: both are constants of its rules.
        message = producer.pubsub(operation_id="sms-77", payload=b"\x00\xffraw bytes")
    assert set(message.attributes) == {"message_key", TRACEPARENT_ATTRIBUTE}
    raw = pubsub_consumer.to_raw(
        "sms", received_pubsub(message.data, dict(message.attributes), message.ordering_key)
    )
    delivery = decode(example.decode_rules("sms"), raw)
    assert isinstance(delivery, Delivery), delivery
    assert (delivery.tenant_id, delivery.operation_id, delivery.job_type) == (
        "acme",
        "sms-77",
        "sms",
    )
    assert delivery.payload == b"\x00\xffraw bytes"  # the raw body, byte for byte
    assert delivery.trace_context == traceparent_of(span)
    assert delivery.ordering_key is None


def test_a_pubsub_ordering_key_becomes_the_rows_ordering_key(example: BridgeConfig) -> None:
    message = Producer.for_subscription(example, "sms").pubsub(
        operation_id="sms-78", payload=b"hi", ordering_key="customer-9"
    )
    raw = pubsub_consumer.to_raw(
        "sms", received_pubsub(message.data, dict(message.attributes), message.ordering_key)
    )
    delivery = decode(example.decode_rules("sms"), raw)
    assert isinstance(delivery, Delivery)
    assert delivery.ordering_key == "customer-9"


def test_a_fifo_message_has_its_group_and_a_dedupe_id_derived_from_the_operation() -> None:
    config = parse_config(ATTRIBUTES, file="attributes.toml")
    producer = Producer.for_subscription(config, "payments")

    def build(operation_id: str, payload: object) -> SqsMessage:
        return producer.sqs(
            tenant_id="acme",
            operation_id=operation_id,
            job_type="refund",
            schema_version="1",
            payload=payload,
            group_id="customer-9",
        )

    message = build("refund-1", REFUND)
    request = message.request()
    assert request["MessageGroupId"] == "customer-9"
    dedupe = request["MessageDeduplicationId"]
    assert len(dedupe) == 64
    assert "acme" not in dedupe
    assert "refund-1" not in dedupe
    # The same operation built again, its payload's keys in another order: the same message.
    assert build("refund-1", dict(reversed(REFUND.items()))) == message
    assert build("refund-2", REFUND).deduplication_id != dedupe
    assert "traceparent" not in message.attributes  # no span is current: no context to send
    delivery = decode(
        config.decode_rules("payments"), sqs_consumer.to_raw("payments", received_sqs(message))
    )
    assert isinstance(delivery, Delivery)
    assert delivery.ordering_key == "customer-9"
    assert delivery.payload == message.body.encode()
    assert message.entry("e1") == {"Id": "e1", **request}


def test_an_explicit_context_is_injected_instead_of_the_current_one(tracer: trace.Tracer) -> None:
    producer = Producer.for_subscription(parse_config(ATTRIBUTES), "payments")
    with tracer.start_as_current_span("the request that asked for the refund") as outer:
        context = trace.set_span_in_context(outer)
    with tracer.start_as_current_span("something else"):
        message = producer.sqs(
            tenant_id="acme",
            operation_id="r-1",
            job_type="refund",
            schema_version="1",
            payload="{}",
            context=context,
        )
    assert message.attributes[TRACEPARENT_ATTRIBUTE] == traceparent_of(outer)


REFUNDS = {"tenant_id": "acme", "job_type": "refund", "schema_version": "1"}
PAYMENTS = {**REFUNDS, "payload": REFUND}


@pytest.mark.parametrize(
    ("subscription", "broker", "fields", "error"),
    [
        pytest.param(
            "refunds",
            "sqs",
            {"tenant_id": "acme", "job_type": "refund", "payload": REFUND},
            "schema_version is required: subscription 'refunds' reads it from body pointer "
            "'/schema_version'",
            id="missing-version",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "schema_version": "3", "payload": REFUND},
            "schema version '3' is not one subscription 'refunds' accepts (1, 2)",
            id="unknown-version",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "job_type": "sms", "payload": REFUND},
            "job type 'sms' is not one subscription 'refunds' accepts (ledger_entry, refund)",
            id="job-type-elsewhere",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "tenant_id": " acme", "payload": {}},
            "tenant_id has leading or trailing whitespace: the bridge would quarantine",
            id="untrimmed-tenant",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "payload": None},
            "would quarantine this message (missing_payload: payload pointer '/refund' is null)",
            id="null-payload",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "payload": b"{}"},
            "takes the payload from body pointer '/refund': pass the JSON value, not bytes",
            id="bytes-for-a-pointer",
        ),
        pytest.param(
            "refunds",
            "sqs",
            {**REFUNDS, "payload": {"amount": float("nan")}},
            "the body cannot be written as strict JSON",
            id="nan",
        ),
        pytest.param(
            "refunds",
            "pubsub",
            PAYMENTS,
            "subscription 'refunds' reads sqs, not pubsub: build its messages with sqs()",
            id="other-broker",
        ),
        pytest.param(
            "sms",
            "pubsub",
            {"tenant_id": "globex", "payload": b"hi"},
            "subscription 'sms' carries one tenant_id only (decode.tenant_id = \"value:acme\")",
            id="other-tenant-on-a-one-tenant-subscription",
        ),
        pytest.param(
            "payments",
            "sqs",
            {**REFUNDS, "payload": b"\xff"},
            "SQS message bodies are text and this payload is not UTF-8",
            id="bytes-on-sqs",
        ),
        pytest.param(
            "payments",
            "sqs",
            {**REFUNDS, "payload": "a\x07bell"},
            "the body holds a character SQS refuses",
            id="control-character-on-sqs",
        ),
        pytest.param(
            "payments",
            "sqs",
            {**PAYMENTS, "deduplication_id": "d-1"},
            "deduplication_id applies to FIFO queues only: give group_id too",
            id="dedupe-without-group",
        ),
        pytest.param(
            "payments",
            "sqs",
            {**PAYMENTS, "group_id": "has space"},
            "group_id must be 1 to 128 printable ASCII characters without spaces",
            id="bad-group",
        ),
    ],
)
def test_a_message_the_bridge_would_not_read_is_refused_saying_why(
    example: BridgeConfig, subscription: str, broker: str, fields: dict[str, Any], error: str
) -> None:
    config = example if subscription in example.subscriptions else parse_config(ATTRIBUTES)
    build = getattr(Producer.for_subscription(config, subscription), broker)
    with pytest.raises(ProducerError) as raised:
        build(operation_id="op-1", **fields)
    assert error in str(raised.value)


def test_an_oversized_body_is_refused_with_the_decoders_reason(example: BridgeConfig) -> None:
    producer = Producer.for_subscription(example, "sms")
    with pytest.raises(ProducerError, match=r"would quarantine this message \(body_too_large"):
        producer.pubsub(operation_id="sms-1", payload=b"x" * 65537)


def test_layouts_a_producer_cannot_honour_are_refused_when_built() -> None:
    by_message_id = ATTRIBUTES.replace(
        'operation_id = "attribute:operation_id"',
        'operation_id = "message_id"\noperation_id_from_message_id = true',
    )
    with pytest.raises(ProducerError, match="takes operation ids from the broker's message id"):
        Producer.for_subscription(parse_config(by_message_id), "payments")
    clash = ATTRIBUTES.replace("attribute:schema_version", "attribute:traceparent")
    with pytest.raises(ProducerError, match="'traceparent' attribute, which carries the trace"):
        Producer.for_subscription(parse_config(clash), "payments")
    with pytest.raises(ProducerError, match=r"has no subscription 'refund' \(it has: payments\)"):
        Producer.for_subscription(parse_config(ATTRIBUTES, file="a.toml"), "refund")


def test_identifiers_read_from_a_body_hashed_whole_are_merged_into_the_payload() -> None:
    config = parse_config(
        ATTRIBUTES.replace('"attribute:operation_id"', '"body:/request_id"'), file="merged.toml"
    )
    producer = Producer.for_subscription(config, "payments")
    message = producer.sqs(
        tenant_id="acme", operation_id="r-9", job_type="refund", schema_version="1", payload=REFUND
    )
    assert json.loads(message.body) == {**REFUND, "request_id": "r-9"}
    raw = sqs_consumer.to_raw("payments", received_sqs(message))
    delivery = decode(config.decode_rules("payments"), raw)
    assert isinstance(delivery, Delivery)
    assert delivery.operation_id == "r-9"
    with pytest.raises(ProducerError, match="another value is already at its pointer"):
        producer.sqs(
            tenant_id="acme",
            operation_id="r-9",
            job_type="refund",
            schema_version="1",
            payload={**REFUND, "request_id": "r-8"},
        )


def test_the_bridge_package_never_imports_the_consumers() -> None:
    for path in (REPO / "bridge").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] == "consumers"], path.name


# -- the README's "Producing messages" examples, run against the decoder --------------------------


def readme_blocks(language: str) -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Producing messages\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def readme_config(source: str) -> str:
    (decode_table,) = readme_blocks("toml")
    where = (
        'source = "sqs"\nqueue_url = "https://sqs.eu-west-1.amazonaws.com/1/refunds"'
        if source == "sqs"
        else 'source = "pubsub"\nsubscription = "projects/p/subscriptions/refunds"'
    )
    return (
        '[jobs.refund]\nhandler = "app.refunds:handler"\ntarget_class = "C"\n\n'
        f'[subscriptions.refunds]\n{where}\njob_types = ["refund"]\n\n{decode_table}'
    )


class Recorder:
    """Stands in for boto3's SQS client and the Pub/Sub publisher: keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **request: Any) -> None:
        self.sent.append(request)

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **attributes: str) -> None:
        self.sent.append({"topic": topic, "data": data, "attributes": attributes})


def decoded_sqs(config_text: str, request: dict[str, Any]) -> Delivery:
    rules = parse_config(config_text).decode_rules("refunds")
    message = {
        "MessageId": "m-1",
        "Body": request["MessageBody"],
        "MessageAttributes": request["MessageAttributes"],
    }
    delivery = decode(rules, sqs_consumer.to_raw("refunds", message))
    assert isinstance(delivery, Delivery), delivery
    return delivery


def test_the_readme_producer_examples_send_what_the_readme_rules_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracer: trace.Tracer
) -> None:
    helper, plain = readme_blocks("python")
    (tmp_path / "bridge.toml").write_text(readme_config("sqs"))
    monkeypatch.chdir(tmp_path)
    with_helper: dict[str, Any] = {}
    exec(compile(helper, "README helper", "exec"), with_helper)
    without: dict[str, Any] = {}
    exec(compile(plain, "README plain", "exec"), without)

    sqs, boto3_sqs, publisher = Recorder(), Recorder(), Recorder()
    with tracer.start_as_current_span("refunds publish", kind=SpanKind.PRODUCER) as span:
        with_helper["send_refund"](sqs, "queue", "acme", "refund-1042", REFUND)
        without["send_refund_boto3"](boto3_sqs, "queue", "acme", "refund-1042", REFUND)
        without["publish_refund_pubsub"](publisher, "topic", "acme", "refund-1042", REFUND)

    (helper_request,) = sqs.sent
    (plain_request,) = boto3_sqs.sent
    assert plain_request == helper_request  # the helper and plain boto3: the same message
    delivery = decoded_sqs(readme_config("sqs"), helper_request)
    assert (delivery.tenant_id, delivery.operation_id, delivery.job_type) == (
        "acme",
        "refund-1042",
        "refund",
    )
    assert delivery.schema_version == "1"
    assert json.loads(delivery.payload) == REFUND
    assert delivery.trace_context == traceparent_of(span)

    (published,) = publisher.sent
    rules = parse_config(readme_config("pubsub")).decode_rules("refunds")
    raw = pubsub_consumer.to_raw(
        "refunds", received_pubsub(published["data"], published["attributes"], "")
    )
    from_pubsub = decode(rules, raw)
    assert isinstance(from_pubsub, Delivery), from_pubsub
    assert from_pubsub.payload == delivery.payload
    assert from_pubsub.key == delivery.key
    assert from_pubsub.trace_context == traceparent_of(span)


def test_a_priority_goes_where_the_rules_read_it_and_decodes_to_itself(
    example: BridgeConfig,
) -> None:
    """The example reads a delivery's priority from an attribute (decimal text); a body rule
    places the JSON integer; a subscription that reads none refuses one."""
    producer = Producer.for_subscription(example, "refunds")
    message = producer.sqs(
        tenant_id="acme",
        operation_id="refund-7",
        job_type="refund",
        schema_version="2",
        payload=REFUND,
        priority=-12,
    )
    assert message.attributes["priority"] == "-12"
    delivery = decode(
        example.decode_rules("refunds"),
        sqs_consumer.to_raw("refunds", received_sqs(message)),
    )
    assert isinstance(delivery, Delivery)
    assert delivery.priority == -12
    in_body = Producer(
        dataclasses.replace(
            example.decode_rules("refunds"), priority=FieldSource.parse("body:/priority")
        ),
        "sqs",
    )
    sent = in_body.sqs(
        tenant_id="acme",
        operation_id="refund-7",
        job_type="refund",
        schema_version="2",
        payload=REFUND,
        priority=3,
    )
    assert json.loads(sent.body)["priority"] == 3
    with pytest.raises(ProducerError, match="whole number"):
        producer.sqs(
            tenant_id="acme",
            operation_id="r",
            job_type="refund",
            schema_version="2",
            payload=REFUND,
            priority=5000,
        )
    unread = Producer(dataclasses.replace(example.decode_rules("refunds"), priority=None), "sqs")
    with pytest.raises(ProducerError, match="reads no priority"):
        unread.sqs(
            tenant_id="acme",
            operation_id="r",
            job_type="refund",
            schema_version="2",
            payload=REFUND,
            priority=1,
        )
