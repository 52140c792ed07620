"""The tenant backlog quota on Pub/Sub, against Google's emulator: a tenant at its quota is
left with the service (neither acked nor nacked) while another tenant's deliveries on the same
subscription are written and acked, and its deliveries are written once it is below the quota.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Delivery, State, TargetClass
from tests.integration.consumers.conformance import SUBSCRIPTION, Db, eventually, inbox_for
from tests.integration.consumers.test_pubsub import REDELIVERY_WAIT, Consumers, consumers, publish
from tests.support.pubsub_emulator import PubSubEmulator

__all__ = ["consumers"]  # the fixture

LEASE = timedelta(seconds=30)


def operations(db: Db, tenant: str) -> set[str]:
    found = db.execute("SELECT operation_id FROM work_item WHERE tenant_id = %s", (tenant,))
    return {str(op) for (op,) in found.fetchall()}


@pytest.mark.slow
def test_a_tenant_at_its_quota_waits_with_the_service_and_is_written_once_below_it(
    emulator: PubSubEmulator, consumers: Consumers, store: PostgresStore, db: Db
) -> None:
    topic, path = emulator.create(ack_deadline=10)
    # the flooding tenant already has three open rows: at a quota of three it may add none
    store.inbox.ingest(
        [
            Delivery(
                tenant_id="flood",
                operation_id=f"old-{i}",
                subscription=SUBSCRIPTION,
                job_type="refund",
                target_class=TargetClass.C,
                payload=b"5",
            )
            for i in range(3)
        ]
    )
    for i in range(3):
        publish(emulator, topic, "flood", f"new-{i}", 5)
        publish(emulator, topic, "quiet", f"q-{i}", 5)
    consumer = consumers.start(path, inbox_for(store), max_lease_duration=1, tenant_backlog_quota=3)

    eventually(
        lambda: operations(db, "quiet") == {"q-0", "q-1", "q-2"} and consumer.counts["acked"] >= 3,
        "the quiet tenant's deliveries written and acked",
    )
    eventually(lambda: consumer.counts["deferred_quota"] >= 3, "the flood's deliveries deferred")
    assert operations(db, "flood") == {"old-0", "old-1", "old-2"}
    assert consumer.counts["nacked"] == 0
    assert "deferred_quota" in consumer.status()[1]

    # Rows settle as a worker would settle them; the deferred deliveries come back and are
    # written, once each.
    def settled_and_written() -> bool:
        for claim in store.claims.claim("w", 10, lease=LEASE):
            store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        return operations(db, "flood") == {f"{a}-{i}" for a in ("old", "new") for i in range(3)}

    eventually(
        settled_and_written,
        "the deferred deliveries written once the tenant is below its quota",
        timeout=3 * REDELIVERY_WAIT,
    )
    eventually(lambda: consumer.counts["acked"] >= 6, "every delivery acked")
    assert consumer.counts["decision.new"] == 6
