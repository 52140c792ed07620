"""Decoding: every rejection reason, good deliveries per source kind, canonical hashing, and
properties over arbitrary input (never raises, never lets an unstorable identifier through)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.ingest.decode import (
    IDENTIFIER_MAX_CHARS,
    DecodeRules,
    FieldSource,
    JobRule,
    PayloadSource,
    Reason,
    SourceKind,
    decode,
)
from bridge.types import Delivery, RawDelivery, Rejection, TargetClass

# Raw values in the cases below carry this marker: no reason may ever repeat it.
SECRET = "S3CR3T"

JOBS = {"refund": JobRule(TargetClass.C, 5), "sms": JobRule(TargetClass.D, 1)}

# Identity from attributes and the body, payload a canonical sub-document.
MIXED = DecodeRules(
    subscription="refunds",
    tenant_id=FieldSource.parse("attribute:tenant_id"),
    operation_id=FieldSource.parse("body:/refund_request_id"),
    job_type=FieldSource.parse("attribute:job_type"),
    schema_version=FieldSource.parse("body:/schema_version"),
    schema_versions=frozenset({"1", "2"}),
    payload=PayloadSource.parse("body:/refund"),
    jobs=JOBS,
    max_body_bytes=4096,
)
# Identity from attributes only, payload the raw body: the body is never parsed.
ATTRIBUTES = DecodeRules(
    subscription="refunds",
    tenant_id=FieldSource.parse("attribute:tenant_id"),
    operation_id=FieldSource.parse("attribute:operation_id"),
    job_type=FieldSource.parse("attribute:job_type"),
    schema_version=FieldSource.parse("attribute:schema_version"),
    jobs=JOBS,
    max_body_bytes=4096,
)
# A delivery's own priority from an attribute.
PRIORITISED = DecodeRules(
    subscription="refunds",
    tenant_id=FieldSource.parse("attribute:tenant_id"),
    operation_id=FieldSource.parse("attribute:operation_id"),
    job_type=FieldSource.parse("attribute:job_type"),
    priority=FieldSource.parse("attribute:priority"),
    jobs=JOBS,
    max_body_bytes=4096,
)
# Constants and the broker's message id.
CONSTANTS = DecodeRules(
    subscription="refunds",
    tenant_id=FieldSource.parse("value:acme"),
    operation_id=FieldSource.parse("message_id"),
    job_type=FieldSource.parse("value:sms"),
    schema_version=FieldSource.parse("value:1"),
    jobs=JOBS,
    max_body_bytes=4096,
)

DOCUMENT: dict[str, Any] = {
    "refund_request_id": "rr-1",
    "schema_version": "1",
    "refund": {"amount": 500, "currency": "EUR", "note": "café"},
}
GOOD_ATTRIBUTES = {"tenant_id": "t-1", "job_type": "refund"}


def body_of(document: object) -> bytes:
    return json.dumps(document).encode()


def raw(
    body: bytes | None = None, attributes: Mapping[str, str] | None = None, **kw: Any
) -> RawDelivery:
    kw.setdefault("subscription", "refunds")
    kw.setdefault("message_id", "m-1")
    return RawDelivery(
        body=body_of(DOCUMENT) if body is None else body,
        attributes=GOOD_ATTRIBUTES if attributes is None else attributes,
        **kw,
    )


def with_document(**changes: object) -> bytes:
    document = {**DOCUMENT, **changes}
    return body_of({k: v for k, v in document.items() if v is not ABSENT})


ABSENT = object()


def storable(text: str) -> bool:
    """What a PostgreSQL text column can hold: valid UTF-8 without NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def clean_identifier(text: str | None) -> bool:
    return (
        text is not None
        and 0 < len(text) <= IDENTIFIER_MAX_CHARS
        and storable(text)
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)
        and text == text.strip()
    )


def assert_safe(result: Delivery | Rejection) -> None:
    """Whatever decode returns can be written to the database and logged."""
    if isinstance(result, Delivery):
        assert clean_identifier(result.tenant_id)
        assert clean_identifier(result.operation_id)
        assert clean_identifier(result.job_type)
        assert result.schema_version is None or clean_identifier(result.schema_version)
        for optional in (result.ordering_key, result.broker_message_id, result.trace_context):
            assert optional is None or (optional and storable(optional))
        assert result.receive_count is None or 0 <= result.receive_count < 2**31
        assert result.payload_hash == hashlib.sha256(result.payload).digest()
    else:
        assert isinstance(result, Rejection)
        code = result.reason.split(":", 1)[0]
        assert code in set(Reason) - {Reason.DECODE_FAILED}, result.reason
        assert storable(result.reason)
        for found in (result.tenant_id, result.operation_id, result.job_type):
            assert found is None or clean_identifier(found)
        assert result.broker_message_id is None or storable(result.broker_message_id)


# -- good deliveries ------------------------------------------------------------------------


def test_attributes_and_body_pointers_decode() -> None:
    result = decode(
        MIXED,
        raw(
            receive_count=3,
            ordering_key="group-7",
            trace_context="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        ),
    )
    assert isinstance(result, Delivery)
    assert (result.tenant_id, result.operation_id, result.job_type) == ("t-1", "rr-1", "refund")
    assert result.schema_version == "1"
    assert result.subscription == "refunds"
    assert result.target_class is TargetClass.C
    assert result.max_attempts == 5
    assert result.broker_message_id == "m-1"
    assert result.receive_count == 3
    assert result.ordering_key == "group-7"
    assert result.trace_context == "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert result.payload == '{"amount":500,"currency":"EUR","note":"café"}'.encode()


def test_attribute_sources_leave_the_body_unparsed() -> None:
    body = b"\xff\x00 not json at all"
    attributes = {
        "tenant_id": "t-1",
        "operation_id": "op-1",
        "job_type": "sms",
        "schema_version": "v3",
    }
    result = decode(ATTRIBUTES, raw(body, attributes))
    assert isinstance(result, Delivery)
    assert (result.operation_id, result.schema_version) == ("op-1", "v3")
    assert result.target_class is TargetClass.D
    assert result.max_attempts == 1
    assert result.payload == body
    assert result.payload_hash == hashlib.sha256(body).digest()


def test_constants_and_the_message_id_decode() -> None:
    result = decode(CONSTANTS, raw(b"hello", {}, message_id="7f2c-41"))
    assert isinstance(result, Delivery)
    assert (result.tenant_id, result.operation_id, result.job_type) == ("acme", "7f2c-41", "sms")
    assert result.schema_version == "1"
    assert result.broker_message_id == "7f2c-41"


def test_json_pointers_follow_rfc_6901() -> None:
    rules = replace(
        MIXED,
        operation_id=FieldSource.parse("body:/ids/1/a~1b~0c"),
        schema_version=None,
        schema_versions=frozenset(),
        payload=PayloadSource.parse("body:"),
    )
    document = {"ids": [{}, {"a/b~c": "deep"}], "z": 1, "a": [True, None]}
    result = decode(rules, raw(body_of(document)))
    assert isinstance(result, Delivery)
    assert result.operation_id == "deep"
    assert result.payload == b'{"a":[true,null],"ids":[{},{"a/b~c":"deep"}],"z":1}'


def test_without_a_schema_source_no_version_is_recorded() -> None:
    result = decode(
        replace(ATTRIBUTES, schema_version=None), raw(b"", {**GOOD_ATTRIBUTES, "operation_id": "o"})
    )
    assert isinstance(result, Delivery)
    assert result.schema_version is None


def test_no_version_check_when_schema_versions_is_empty() -> None:
    rules = replace(MIXED, schema_versions=frozenset())
    result = decode(rules, raw(with_document(schema_version="99-beta")))
    assert isinstance(result, Delivery)
    assert result.schema_version == "99-beta"


# -- pass-through fields --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "given", "kept"),
    [
        ("broker_message_id", "m\x00-1", None),
        ("broker_message_id", "m-\ud800", None),
        ("broker_message_id", "", None),
        ("broker_message_id", "m" * 1025, None),
        ("trace_context", "00-\x00", None),
        ("trace_context", "00-é", None),
        ("trace_context", "0" * 513, None),
        ("receive_count", -1, None),
        ("receive_count", 2**31, None),
        ("receive_count", True, None),
        ("receive_count", 0, 0),
        ("ordering_key", "", None),
    ],
)
def test_unclean_optional_fields_are_dropped(field: str, given: object, kept: object) -> None:
    name = "message_id" if field == "broker_message_id" else field
    result = decode(MIXED, raw(**{name: given}))
    assert isinstance(result, Delivery)
    assert getattr(result, field) == kept


def test_the_message_id_of_a_rejection_is_sanitised_too() -> None:
    result = decode(MIXED, raw(b"{", message_id="m\x00"))
    assert isinstance(result, Rejection)
    assert result.broker_message_id is None


# -- rejections -----------------------------------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000


class ExplodingAttributes(Mapping[str, str]):
    """An attribute map whose lookups fail: a bug in a consumer, not in the message."""

    def __getitem__(self, key: str) -> str:
        raise RuntimeError(SECRET)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


REJECTIONS = [
    pytest.param(
        MIXED,
        raw(subscription="other"),
        "subscription_mismatch: the delivery is for another subscription",
        id="subscription_mismatch",
    ),
    pytest.param(
        MIXED,
        raw(b"{" + b" " * 4096 + SECRET.encode()),
        "body_too_large: 4103 bytes exceeds max_body_bytes (4096)",
        id="body_too_large",
    ),
    pytest.param(
        ATTRIBUTES,
        raw(b"x" * 4097, {**GOOD_ATTRIBUTES, "operation_id": "o"}),
        "body_too_large: 4097 bytes exceeds max_body_bytes (4096)",
        id="body_too_large-unparsed-body",
    ),
    pytest.param(
        MIXED,
        raw(b'{"refund_request_id": "' + SECRET.encode() + b'\xff"}'),
        "body_not_utf8: invalid UTF-8 at byte 29",
        id="body_not_utf8",
    ),
    pytest.param(
        MIXED,
        raw(b'{"refund_request_id": ' + SECRET.encode() + b"}"),
        "body_not_json: invalid JSON at character 22",
        id="body_not_json",
    ),
    pytest.param(
        MIXED,
        raw(b'{"refund_request_id": "a", "refund_request_id": "' + SECRET.encode() + b'"}'),
        "body_not_json: an object has a duplicate key",
        id="body_not_json-duplicate-key",
    ),
    pytest.param(
        MIXED,
        raw(b'{"refund": NaN}'),
        "body_not_json: NaN and Infinity are not JSON",
        id="body_not_json-nan",
    ),
    pytest.param(
        MIXED,
        raw(b'{"refund": 1e400}'),
        "body_not_json: a number is beyond the range of a double",
        id="body_not_json-huge-float",
    ),
    pytest.param(
        replace(MIXED, max_body_bytes=8192),
        raw(b'{"refund": ' + b"9" * 5000 + b"}"),
        "body_not_json: an integer is too long",
        id="body_not_json-huge-int",
    ),
    pytest.param(
        replace(MIXED, max_body_bytes=len(DEEP)),
        raw(DEEP),
        "body_not_json: nested too deeply",
        id="body_not_json-deep",
    ),
    pytest.param(
        MIXED,
        raw(b"\xef\xbb\xbf" + body_of(DOCUMENT)),
        "body_not_json: invalid JSON at character 0",
        id="body_not_json-bom",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"job_type": "refund"}),
        "missing_tenant_id: attribute 'tenant_id' is absent",
        id="missing_tenant_id",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "", "job_type": "refund"}),
        "empty_tenant_id: attribute 'tenant_id' is empty",
        id="empty_tenant_id",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": " \t ", "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' contains a control character",
        id="invalid_tenant_id-tab",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "   ", "job_type": "refund"}),
        "empty_tenant_id: attribute 'tenant_id' is only whitespace",
        id="empty_tenant_id-whitespace",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": SECRET + "\x00", "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' contains a NUL character",
        id="invalid_tenant_id-nul",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": SECRET + "\x1b[31m", "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' contains a control character",
        id="invalid_tenant_id-control",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": SECRET + "\ud800", "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' is not valid Unicode text (lone surrogate)",
        id="invalid_tenant_id-surrogate",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": SECRET + "x" * IDENTIFIER_MAX_CHARS, "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' is longer than 256 characters",
        id="invalid_tenant_id-long",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": SECRET + " ", "job_type": "refund"}),
        "invalid_tenant_id: attribute 'tenant_id' has leading or trailing whitespace",
        id="invalid_tenant_id-whitespace",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=ABSENT)),
        "missing_operation_id: body pointer '/refund_request_id' finds nothing",
        id="missing_operation_id",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=None)),
        "missing_operation_id: body pointer '/refund_request_id' is null",
        id="missing_operation_id-null",
    ),
    pytest.param(
        MIXED,
        raw(body_of(["not", "an", "object"])),
        "missing_operation_id: body pointer '/refund_request_id' finds nothing",
        id="missing_operation_id-not-an-object",
    ),
    pytest.param(
        CONSTANTS,
        raw(b"", {}, message_id=None),
        "missing_operation_id: the broker message id is absent",
        id="missing_operation_id-message-id",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id="")),
        "empty_operation_id: body pointer '/refund_request_id' is empty",
        id="empty_operation_id",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=12345)),
        "invalid_operation_id: body pointer '/refund_request_id' is a JSON number, not a string",
        id="invalid_operation_id-number",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=1.5)),
        "invalid_operation_id: body pointer '/refund_request_id' is a JSON number, not a string",
        id="invalid_operation_id-float",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=True)),
        "invalid_operation_id: body pointer '/refund_request_id' is a JSON boolean, not a string",
        id="invalid_operation_id-boolean",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id={"id": SECRET})),
        "invalid_operation_id: body pointer '/refund_request_id' is a JSON object or array, "
        "not a string",
        id="invalid_operation_id-object",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=SECRET + "\u0000")),
        "invalid_operation_id: body pointer '/refund_request_id' contains a NUL character",
        id="invalid_operation_id-escaped-nul",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund_request_id=SECRET + "\ud800")),
        "invalid_operation_id: body pointer '/refund_request_id' is not valid Unicode text "
        "(lone surrogate)",
        id="invalid_operation_id-escaped-surrogate",
    ),
    pytest.param(
        CONSTANTS,
        raw(b"", {}, message_id=SECRET + "\x00"),
        "invalid_operation_id: the broker message id contains a NUL character",
        id="invalid_operation_id-message-id",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "t-1"}),
        "missing_job_type: attribute 'job_type' is absent",
        id="missing_job_type",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "t-1", "job_type": ""}),
        "empty_job_type: attribute 'job_type' is empty",
        id="empty_job_type",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "t-1", "job_type": SECRET + "\x7f"}),
        "invalid_job_type: attribute 'job_type' contains a control character",
        id="invalid_job_type",
    ),
    pytest.param(
        MIXED,
        raw(attributes={"tenant_id": "t-1", "job_type": SECRET}),
        "unknown_job_type: not one of the subscription's job_types",
        id="unknown_job_type",
    ),
    pytest.param(
        MIXED,
        raw(with_document(schema_version=ABSENT)),
        "missing_schema_version: body pointer '/schema_version' finds nothing",
        id="missing_schema_version",
    ),
    pytest.param(
        MIXED,
        raw(with_document(schema_version="")),
        "empty_schema_version: body pointer '/schema_version' is empty",
        id="empty_schema_version",
    ),
    pytest.param(
        MIXED,
        raw(with_document(schema_version=1)),
        "invalid_schema_version: body pointer '/schema_version' is a JSON number, not a string",
        id="invalid_schema_version",
    ),
    pytest.param(
        MIXED,
        raw(with_document(schema_version=SECRET)),
        "unknown_schema_version: not one of the subscription's schema_versions",
        id="unknown_schema_version",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund=ABSENT)),
        "missing_payload: payload pointer '/refund' finds nothing",
        id="missing_payload",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund=None)),
        "missing_payload: payload pointer '/refund' is null",
        id="missing_payload-null",
    ),
    pytest.param(
        MIXED,
        raw(with_document(refund={"note": SECRET + "\udc00"})),
        "invalid_payload: payload pointer '/refund' holds a lone surrogate escape",
        id="invalid_payload",
    ),
    pytest.param(
        MIXED,
        raw(ordering_key=SECRET + "\x00"),
        "invalid_ordering_key: the ordering key contains a control character or a lone surrogate",
        id="invalid_ordering_key",
    ),
    pytest.param(
        MIXED,
        raw(ordering_key=SECRET * 200),
        "invalid_ordering_key: the ordering key is longer than 1024 characters",
        id="invalid_ordering_key-long",
    ),
    pytest.param(
        PRIORITISED,
        raw(attributes={**GOOD_ATTRIBUTES, "operation_id": "o-1", "priority": "high"}),
        "invalid_priority: attribute 'priority' is not a whole number from -1000 to 1000",
        id="invalid_priority",
    ),
    pytest.param(
        PRIORITISED,
        raw(attributes={**GOOD_ATTRIBUTES, "operation_id": "o-1", "priority": "1001"}),
        "invalid_priority: attribute 'priority' is not a whole number from -1000 to 1000",
        id="invalid_priority-range",
    ),
    pytest.param(
        PRIORITISED,
        raw(attributes={**GOOD_ATTRIBUTES, "operation_id": "o-1", "priority": "+3"}),
        "invalid_priority: attribute 'priority' is not a whole number from -1000 to 1000",
        id="invalid_priority-sign",
    ),
    pytest.param(
        MIXED,
        raw(attributes=ExplodingAttributes()),
        "decode_failed: unexpected RuntimeError",
        id="decode_failed",
    ),
]


@pytest.mark.parametrize(("rules", "delivery", "reason"), REJECTIONS)
def test_each_rejection_has_its_reason(
    rules: DecodeRules, delivery: RawDelivery, reason: str
) -> None:
    result = decode(rules, delivery)
    assert isinstance(result, Rejection)
    assert result.reason == reason
    assert SECRET not in result.reason
    assert result.subscription == rules.subscription
    assert result.body == delivery.body
    assert result.broker_message_id == delivery.message_id or "\x00" in (delivery.message_id or "")


def test_every_reason_code_has_a_case() -> None:
    covered = {p.values[2].split(":", 1)[0] for p in REJECTIONS}
    assert covered == set(Reason)


def test_a_rejection_keeps_the_identifiers_it_found() -> None:
    result = decode(MIXED, raw(with_document(schema_version="7")))
    assert isinstance(result, Rejection)
    assert result.reason.startswith("unknown_schema_version:")
    assert (result.tenant_id, result.operation_id, result.job_type) == ("t-1", "rr-1", "refund")


def test_a_rejection_keeps_an_unknown_job_type_but_never_an_unstorable_one() -> None:
    unknown = decode(MIXED, raw(attributes={"tenant_id": "t-1", "job_type": "payout"}))
    assert isinstance(unknown, Rejection)
    assert unknown.job_type == "payout"
    broken = decode(MIXED, raw(attributes={"tenant_id": "t\x00", "job_type": "refund"}))
    assert isinstance(broken, Rejection)
    assert (broken.tenant_id, broken.operation_id) == (None, "rr-1")


def test_the_size_is_checked_before_the_body_is_parsed() -> None:
    result = decode(MIXED, raw(b"\xff" * 5000))
    assert isinstance(result, Rejection)
    assert result.reason.startswith("body_too_large:")
    assert result.tenant_id == "t-1"  # attributes are still read, for triage


def test_the_first_problem_is_reported() -> None:
    result = decode(MIXED, raw(with_document(refund_request_id=7), attributes={}))
    assert isinstance(result, Rejection)
    assert result.reason.startswith("missing_tenant_id:")


# -- payload hashing ------------------------------------------------------------------------


def test_pointer_payloads_are_canonical_json() -> None:
    one = b'{"refund": {"b": [1, 2.5, "\\u00e9"], "a": {"y": null, "x": true}}, ' + (
        b'"refund_request_id": "rr-1", "schema_version": "1"}'
    )
    other = (
        b'{\n  "schema_version":"1","refund_request_id":"rr-1",\n'
        b'  "refund":{ "a" : {"x":true,"y":null},\t"b":[1,2.5,"\xc3\xa9"]}\n}'
    )
    first, second = decode(MIXED, raw(one)), decode(MIXED, raw(other))
    assert isinstance(first, Delivery)
    assert isinstance(second, Delivery)
    assert first.payload == '{"a":{"x":true,"y":null},"b":[1,2.5,"é"]}'.encode()
    assert first.payload == second.payload
    assert first.payload_hash == second.payload_hash


def test_pointer_payloads_still_tell_different_values_apart() -> None:
    first = decode(MIXED, raw(with_document(refund={"amount": 1})))
    second = decode(MIXED, raw(with_document(refund={"amount": 1.0})))
    assert isinstance(first, Delivery)
    assert isinstance(second, Delivery)
    assert first.payload_hash != second.payload_hash


def test_whole_body_payloads_are_exact() -> None:
    rules = replace(ATTRIBUTES, schema_version=None)
    attributes = {**GOOD_ATTRIBUTES, "operation_id": "op-1"}
    compact, spaced = b'{"a":1,"b":2}', b'{"b": 2, "a": 1}'
    first, second = decode(rules, raw(compact, attributes)), decode(rules, raw(spaced, attributes))
    assert isinstance(first, Delivery)
    assert isinstance(second, Delivery)
    assert (first.payload, second.payload) == (compact, spaced)
    assert first.payload_hash != second.payload_hash


# -- properties -----------------------------------------------------------------------------

HOSTILE = st.sampled_from(["\x00", "\ud800", "\udfff", "\x1b", "\x85", " ", "\t", "é", "/", "~"])
TEXT = st.text(st.one_of(st.characters(exclude_categories=()), HOSTILE), max_size=40)
NAMES = ["tenant_id", "operation_id", "job_type", "schema_version"]
VALUES = st.one_of(TEXT, st.sampled_from(["refund", "sms", "t-1", "1", "", " x"]))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), TEXT, st.sampled_from(["refund", "1"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=16,
)
# Mostly plausible identifiers, so that deliveries are produced and checked too.
FIELDS = {
    "refund_request_id": st.one_of(st.sampled_from(["rr-1", "r 2", "é"]), VALUES, JSON),
    "schema_version": st.one_of(st.sampled_from(["1", "2"]), VALUES, JSON),
    "refund": JSON,
}
DOCUMENTS = st.one_of(
    JSON, st.fixed_dictionaries(FIELDS), st.fixed_dictionaries({}, optional=FIELDS)
)
RULES = st.sampled_from([MIXED, ATTRIBUTES, CONSTANTS])
FAST = settings(deadline=None, max_examples=150)


def serialised(document: object, ascii_only: bool) -> bytes:
    # With surrogates and ensure_ascii=False the bytes are not UTF-8: also worth decoding.
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def decoded_twice(rules: DecodeRules, delivery: RawDelivery) -> Delivery | Rejection:
    first, second = decode(rules, delivery), decode(rules, delivery)
    assert first == second  # deterministic, down to the payload hash
    assert_safe(first)
    return first


@FAST
@given(rules=RULES, body=st.binary(max_size=600), message_id=st.none() | TEXT)
def test_any_bytes_decode_without_raising(
    rules: DecodeRules, body: bytes, message_id: str | None
) -> None:
    decoded_twice(rules, raw(body, message_id=message_id))


@FAST
@given(rules=RULES, attributes=st.dictionaries(st.text(), st.text()))
def test_any_attribute_map_decodes_without_raising(
    rules: DecodeRules, attributes: dict[str, str]
) -> None:
    decoded_twice(rules, raw(attributes=attributes))


BROKER_FIELDS = st.fixed_dictionaries(
    {
        "message_id": st.none() | VALUES,
        "ordering_key": st.none() | TEXT,
        "trace_context": st.none() | TEXT,
        "receive_count": st.none() | st.integers(),
    }
)


@FAST
@given(
    rules=RULES,
    attributes=st.dictionaries(st.one_of(st.sampled_from(NAMES), TEXT), VALUES),
    broker=BROKER_FIELDS,
)
def test_hostile_attributes_and_broker_fields_never_reach_a_delivery(
    rules: DecodeRules, attributes: dict[str, str], broker: dict[str, Any]
) -> None:
    decoded_twice(rules, raw(b"{}", attributes, **broker))


@pytest.mark.slow
@FAST
@given(
    document=DOCUMENTS, ascii_only=st.booleans(), attributes=st.sampled_from([GOOD_ATTRIBUTES, {}])
)
def test_any_json_document_decodes_without_raising(
    document: object, ascii_only: bool, attributes: dict[str, str]
) -> None:
    decoded_twice(MIXED, raw(serialised(document, ascii_only), attributes))


def shuffled(value: object, rnd: random.Random) -> object:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


PLAIN_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
).filter(lambda v: v is not None)


@pytest.mark.slow
@FAST
@given(
    value=PLAIN_JSON, rnd=st.randoms(use_true_random=False), indent=st.sampled_from([None, 1, "\t"])
)
def test_pointer_payload_hash_ignores_key_order_and_whitespace(
    value: object, rnd: random.Random, indent: int | str | None
) -> None:
    document = {"refund_request_id": "rr-1", "schema_version": "1", "refund": value}
    compact = json.dumps(document, separators=(",", ":")).encode()
    loose = json.dumps(shuffled(document, rnd), indent=indent, ensure_ascii=False).encode()
    first, second = decoded_twice(MIXED, raw(compact)), decoded_twice(MIXED, raw(loose))
    assert isinstance(first, Delivery)
    assert isinstance(second, Delivery)
    assert first.payload_hash == second.payload_hash


@FAST
@given(body=st.binary(max_size=300))
def test_whole_body_payload_is_the_body_itself(body: bytes) -> None:
    attributes = {**GOOD_ATTRIBUTES, "operation_id": "op-1", "schema_version": "1"}
    result = decoded_twice(ATTRIBUTES, raw(body, attributes))
    assert isinstance(result, Delivery)
    assert result.payload == body
    assert result.payload_hash == hashlib.sha256(body).digest()


# -- rules built by hand --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"operation_id": FieldSource(SourceKind.VALUE, "x")}, "constant operation id"),
        ({"tenant_id": FieldSource(SourceKind.MESSAGE_ID)}, "operation_id only"),
        ({"jobs": {}}, "at least one job type"),
        ({"schema_version": None}, "needs a schema_version source"),
        ({"max_body_bytes": -1}, "cannot be negative"),
    ],
)
def test_rules_refuse_what_the_configuration_refuses(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        replace(MIXED, **change)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tenant", "unknown field source"),
        ("attribute:", "attribute name is empty"),
        ("body:x", "starts with '/'"),
        ("body:/a~", "must be followed by"),
        ("value:", "constant is empty"),
        ("value:a\x00", "constant contains a NUL"),
    ],
)
def test_field_source_spelling_is_checked(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        FieldSource.parse(text)


def test_field_sources_print_as_they_are_spelled() -> None:
    for text in ("attribute:tenant_id", "body:/a/b", "body:", "value:acme", "message_id"):
        assert str(FieldSource.parse(text)) == text
    for text in ("body", "body:", "body:/refund"):
        assert str(PayloadSource.parse(text)) == text


@pytest.mark.parametrize(
    ("attributes", "priority"),
    [({}, 0), ({"priority": "7"}, 7), ({"priority": "-1000"}, -1000), ({"priority": "0"}, 0)],
)
def test_a_delivery_takes_its_own_priority_or_else_its_job_types(
    attributes: dict[str, str], priority: int
) -> None:
    found = decode(
        PRIORITISED, raw(attributes={**GOOD_ATTRIBUTES, "operation_id": "o-1", **attributes})
    )
    assert isinstance(found, Delivery)
    assert found.priority == priority


def test_a_priority_from_the_body_is_a_json_integer_not_a_float_or_a_boolean() -> None:
    rules = replace(MIXED, priority=FieldSource.parse("body:/priority"))
    for value, expected in ((3, 3), ("3", 3), (None, 0), (ABSENT, 0)):
        found = decode(rules, raw(with_document(priority=value)))
        assert isinstance(found, Delivery), value
        assert found.priority == expected
    for value in (3.0, True, [3], "3.5"):
        found = decode(rules, raw(with_document(priority=value)))
        assert isinstance(found, Rejection), value
        assert found.reason.startswith("invalid_priority:")
