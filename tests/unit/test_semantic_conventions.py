"""The messaging attributes fencebridge emits are the semantic conventions' own names.

The conventions are still marked as in development upstream; when a name moves, this test
fails against the installed `opentelemetry-semantic-conventions`, and `names.py` (with the
version it states, and the docs) is the one place to change.
"""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.schemas import Schemas

from bridge.telemetry import names as n


def test_the_messaging_attributes_are_the_conventions_names() -> None:
    assert n.MESSAGING_SYSTEM == messaging.MESSAGING_SYSTEM
    assert n.MESSAGING_OPERATION_TYPE == messaging.MESSAGING_OPERATION_TYPE
    assert n.MESSAGING_OPERATION_NAME == messaging.MESSAGING_OPERATION_NAME
    assert n.MESSAGING_DESTINATION == messaging.MESSAGING_DESTINATION_NAME
    assert n.MESSAGING_SUBSCRIPTION == messaging.MESSAGING_DESTINATION_SUBSCRIPTION_NAME
    assert n.MESSAGING_MESSAGE_ID == messaging.MESSAGING_MESSAGE_ID
    assert n.MESSAGING_BATCH_COUNT == messaging.MESSAGING_BATCH_MESSAGE_COUNT


def test_the_operation_types_used_are_the_conventions_values() -> None:
    known = {v.value for v in messaging.MessagingOperationTypeValues}
    assert {"receive", "process", "settle"} <= known


def test_the_stated_version_is_a_published_schema() -> None:
    assert n.SCHEMA_URL in {s.value for s in Schemas}
