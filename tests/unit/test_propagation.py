"""The producer's trace context from message attributes: W3C, the Pub/Sub client's, X-Ray."""

from __future__ import annotations

import pytest
from opentelemetry.trace import TraceFlags

from bridge.telemetry.propagation import (
    ATTRIBUTE_NAMES,
    from_xray,
    link_to,
    producer_traceparent,
    valid_traceparent,
)
from consumers.sqs.source import to_raw

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
W3C = f"00-{TRACE_ID}-{SPAN_ID}-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
XRAY_AS_W3C = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"


# -- W3C traceparent -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (W3C, W3C),
        (f"00-{TRACE_ID}-{SPAN_ID}-00", f"00-{TRACE_ID}-{SPAN_ID}-00"),  # not sampled: still linked
        (f"  {W3C}\n", W3C),  # surrounding whitespace from a hand-written attribute
        (W3C.upper(), W3C),  # hex is case-insensitive; kept in the canonical lower case
    ],
)
def test_a_valid_traceparent_is_kept_in_canonical_form(value: str, expected: str) -> None:
    assert valid_traceparent(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "not a traceparent",
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id: invalid by the spec
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero span id: invalid by the spec
        f"01-{TRACE_ID}-{SPAN_ID}-01",  # a version this parser does not know
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is forbidden
        f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",  # trace id one digit short
        f"00-{TRACE_ID}-{SPAN_ID}0-01",  # span id one digit long
        f"00-{TRACE_ID}-{SPAN_ID}-1",  # flags one digit short
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # trailing fields are not version 00
        f"00-{TRACE_ID.replace('4', 'g')}-{SPAN_ID}-01",  # not hex
        f"00_{TRACE_ID}_{SPAN_ID}_01",  # wrong separators
    ],
)
def test_an_unusable_traceparent_is_rejected(value: str | None) -> None:
    assert valid_traceparent(value) is None


# -- X-Ray -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (XRAY, XRAY_AS_W3C),
        (XRAY.replace("Sampled=1", "Sampled=0"), XRAY_AS_W3C[:-2] + "00"),
        (XRAY.replace(";Sampled=1", ""), XRAY_AS_W3C[:-2] + "00"),  # no decision: not sampled
        (XRAY.replace("Sampled=1", "Sampled=?"), XRAY_AS_W3C[:-2] + "00"),  # deferred
        (XRAY.replace(";", "; "), XRAY_AS_W3C),  # spaces after separators
        ("Sampled=1;Parent=53995c3f42cd8ad8;Root=1-5759e988-bd862e3fe1be46a994272793", XRAY_AS_W3C),
        (f"{XRAY};Lineage=a87bd80c:1|68fd508a:5", XRAY_AS_W3C),  # unknown fields are ignored
        (
            "Root=1-5759E988-BD862E3FE1BE46A994272793;Parent=53995C3F42CD8AD8;Sampled=1",
            XRAY_AS_W3C,  # upper-case hex
        ),
    ],
)
def test_an_xray_header_converts_to_a_w3c_traceparent(header: str, expected: str) -> None:
    assert from_xray(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",  # no parent: nothing to link to
        "Parent=53995c3f42cd8ad8;Sampled=1",  # no root
        "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",  # unknown version
        "Root=1-5759e98-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",  # epoch too short
        "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",  # id too short
        "Root=1-5759e988bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",  # missing dash
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad",  # parent too short
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=zz995c3f42cd8ad8",  # parent not hex
        "Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8",  # all-zero trace
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",  # all-zero parent
        "Root;Parent;Sampled",  # fields without values
    ],
)
def test_a_malformed_xray_header_gives_no_context(header: str | None) -> None:
    assert from_xray(header) is None


# -- preference order --------------------------------------------------------------------------


def test_the_attribute_names_in_order_of_preference() -> None:
    assert ATTRIBUTE_NAMES == ("traceparent", "googclient_traceparent")


@pytest.mark.parametrize(
    ("attributes", "xray", "expected"),
    [
        ({"traceparent": W3C, "googclient_traceparent": OTHER}, XRAY, W3C),
        ({"googclient_traceparent": OTHER}, XRAY, OTHER),
        ({}, XRAY, XRAY_AS_W3C),
        ({}, None, None),
        # an unusable value does not hide a usable one further down the order
        ({"traceparent": "garbage", "googclient_traceparent": OTHER}, XRAY, OTHER),
        ({"traceparent": f"00-{'0' * 32}-{SPAN_ID}-01"}, XRAY, XRAY_AS_W3C),
        ({"traceparent": "garbage", "googclient_traceparent": ""}, "garbage", None),
        # other attributes are never read as trace context
        ({"tracestate": "k=v", "b3": f"{TRACE_ID}-{SPAN_ID}-1"}, None, None),
    ],
)
def test_the_best_context_a_delivery_carries_wins(
    attributes: dict[str, str], xray: str | None, expected: str | None
) -> None:
    assert producer_traceparent(attributes, xray) == expected


def test_the_sqs_consumer_takes_the_trace_context_from_attributes_then_aws_trace_header() -> None:
    def message(attributes: dict[str, str], system: dict[str, str]) -> dict[str, object]:
        return {
            "MessageId": "m-1",
            "Body": "{}",
            "MessageAttributes": {
                k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
            },
            "Attributes": system,
        }

    both = message({"traceparent": W3C}, {"AWSTraceHeader": XRAY})
    assert to_raw("orders", both).trace_context == W3C
    assert to_raw("orders", message({}, {"AWSTraceHeader": XRAY})).trace_context == XRAY_AS_W3C
    assert to_raw("orders", message({"traceparent": "junk"}, {})).trace_context is None


# -- links ---------------------------------------------------------------------------------------


def test_a_link_carries_the_producer_span_context_as_remote() -> None:
    link = link_to(W3C)
    assert link is not None
    context = link.context
    assert context.trace_id == int(TRACE_ID, 16)
    assert context.span_id == int(SPAN_ID, 16)
    assert context.trace_flags == TraceFlags(TraceFlags.SAMPLED)
    assert context.is_remote


def test_an_unsampled_producer_is_linked_without_the_sampled_flag() -> None:
    link = link_to(W3C[:-2] + "00")
    assert link is not None
    assert not link.context.trace_flags.sampled


@pytest.mark.parametrize("value", [None, "", "junk", f"00-{'0' * 32}-{SPAN_ID}-01"])
def test_no_link_without_a_valid_context(value: str | None) -> None:
    assert link_to(value) is None
