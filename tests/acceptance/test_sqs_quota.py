"""The tenant backlog quota end to end: ``fencebridge run`` between moto's SQS server and
PostgreSQL, one queue carrying a flooding tenant and a quiet one.

While the flooding tenant's rows are held open (its handler answers "rate limited" until the
test lets go), the bridge writes no more of its operations than the quota and leaves the rest in
the queue, and the quiet tenant's operations on the same queue all succeed. Once the flood's
rows can finish, its deferred messages come back from SQS and every operation is written and
succeeds exactly once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.gated import create_gated_tables, open_gate
from tests.support.sqs_server import SqsServer, sqs_server
from tests.support.waiting import eventually

GATED = "gated"
GATED_JOB = Job("tests.support.gated:GatedEffect", "A", lease_seconds=5.0)
FLOOD, QUIET = "flood", "quiet"
QUOTA = 50
FLOOD_MESSAGES = 1000
QUIET_MESSAGES = 100
#: long enough for the receiving loop to get past the whole flood once: moto hands messages
#: out in the order they were sent, so a flood back sooner would come first again
BACKOFF = 90
DEADLINE = 300.0


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


class QuotaBridgeConfig(SqsBridgeConfig):
    """The SQS test bridge with ``[bridge] tenant_backlog_quota`` and the SQS backoff of the
    deliveries it defers."""

    def toml(self) -> str:
        text = super().toml()
        text = text.replace("[bridge]\n", f"[bridge]\ntenant_backlog_quota = {QUOTA}\n", 1)
        return text.replace(
            "\nvisibility_timeout_seconds",
            f"\nquota_backoff_seconds = {BACKOFF}\nvisibility_timeout_seconds",
            1,
        )


def send(sqs: Any, queue_url: str, messages: Sequence[tuple[str, str]]) -> None:
    """One message per (tenant, operation), in batches of ten."""
    for start in range(0, len(messages), 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps({}),
                "MessageAttributes": {
                    "tenant_id": {"DataType": "String", "StringValue": tenant},
                    "operation_id": {"DataType": "String", "StringValue": op},
                    "job_type": {"DataType": "String", "StringValue": GATED},
                },
            }
            for i, (tenant, op) in enumerate(messages[start : start + 10])
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        assert not response.get("Failed"), response


def on_queue(sqs: Any, queue_url: str) -> int:
    """Messages still in the queue, visible or in flight, as SQS counts them."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def states(url: str, tenant: str) -> Counter[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT state FROM work_item WHERE tenant_id = %s", (tenant,)
        ).fetchall()
    return Counter(str(s) for (s,) in rows)


def effects(url: str, tenant: str) -> Counter[str]:
    """How many times each operation's class A effect was committed."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation_id FROM test_effect WHERE tenant_id = %s", (tenant,)
        ).fetchall()
    return Counter(str(op) for (op,) in rows)


def deferred_count(bridge: BridgeProcess) -> int:
    """``deferred_quota`` of the subscription, as ``/readyz`` shows it."""
    _, body = bridge.probe("/readyz")
    found = re.search(r"deferred_quota (\d+)", body["checks"]["subscription:orders"])
    return int(found[1]) if found else 0


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(900)
def test_the_quota_leaves_a_flooding_tenant_in_the_queue_while_another_tenant_flows(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    sqs = moto.client()
    create_gated_tables(db_url, closed_for=(FLOOD,))
    queue_url = moto.create_queue("quota", VisibilityTimeout="3")
    cfg = QuotaBridgeConfig(
        queue_url=queue_url,
        endpoint_url=moto.endpoint,
        jobs={GATED: GATED_JOB},
        visibility_timeout_seconds=3,
    )
    flood = [(FLOOD, f"f-{i}") for i in range(FLOOD_MESSAGES)]
    quiet = [(QUIET, f"q-{i}") for i in range(QUIET_MESSAGES)]
    # One queue, the quiet tenant's messages among the flood's: one in every eleven.
    mixed = [m for i in range(QUIET_MESSAGES) for m in (*flood[i * 10 : i * 10 + 10], quiet[i])]
    send(sqs, queue_url, mixed)
    assert on_queue(sqs, queue_url) == FLOOD_MESSAGES + QUIET_MESSAGES

    with BridgeProcess.start(cfg, tmp_path, bridge_env(db_url)) as bridge:
        bridge.wait_ready()

        # The flood is held open at the quota, and the quiet tenant's work all succeeds.
        eventually(
            lambda: states(db_url, QUIET) == Counter(succeeded=QUIET_MESSAGES),
            "every quiet operation succeeded",
            timeout=DEADLINE,
        )
        assert effects(db_url, QUIET) == Counter(op for _, op in quiet)
        held = states(db_url, FLOOD)
        # one receiving loop: a single writer never passes the quota
        assert sum(held.values()) == QUOTA, held
        assert set(held) <= {"queued", "claimed"}, held
        assert effects(db_url, FLOOD) == Counter()
        # the rest of the flood is in the queue (out of sight for the backoff), not in the
        # database
        eventually(
            lambda: on_queue(sqs, queue_url) == FLOOD_MESSAGES - QUOTA,
            "the flood's deferred messages to be all that is left in the queue",
            timeout=DEADLINE,
        )
        assert deferred_count(bridge) > 0
        # Let the flood finish: its deferred messages come back and are written, once each.
        open_gate(db_url, FLOOD)
        eventually(
            lambda: states(db_url, FLOOD) == Counter(succeeded=FLOOD_MESSAGES),
            "every flood operation succeeded",
            timeout=DEADLINE,
        )
        eventually(lambda: on_queue(sqs, queue_url) == 0, "an empty queue", timeout=DEADLINE)
        assert effects(db_url, FLOOD) == Counter(op for _, op in flood)
        assert effects(db_url, QUIET) == Counter(op for _, op in quiet)
        assert deferred_count(bridge) >= FLOOD_MESSAGES - QUOTA
        assert bridge.terminate() == 0, bridge.logs()
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM rejected_delivery").fetchone() == (0,)
