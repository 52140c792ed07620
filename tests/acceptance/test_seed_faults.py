"""The seeds' fault-injection tests with real worker processes, real signals, real PostgreSQL.

1. A worker paused after its claim, past lease expiry, wakes up after a takeover: its write is
   refused (class A at the fenced lock, class B by the target's own condition). Paused *inside*
   its class A transaction instead, it keeps the row locked: nobody can take over, and its
   commit is the only effect.
2. A class C worker killed after the provider charged and before completion: the next claim
   reconciles by key and completes without a second charge.
D. A class D worker killed after its call: the sweeper parks the row unknown, and a redrive
   parks it unknown again without calling; the target was called exactly once. Killed after its
   claim and before its intent, it called nothing: the sweeper sends the row back to the queue
   and the next claim calls once.

Workers are ``tests.support.worker_process`` subprocesses; their gates order the steps, the
signals are the faults. The only waiting is for the database clock to pass a lease, by polling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.demo import balances, invoices, payments
from bridge.demo.provider import PaymentProvider
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.store import PostgresStore, Swept
from bridge.types import Delivery, Key, RedriveFilter, State, TargetClass, Ticket
from tests.support.worker_process import NOTIFY_JOB, Claimed, WorkerProcess

Db = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]

SECRET = "seed-fault-tests-identity-secret"
LEASE_SECONDS = 1.0
LAPSE_TIMEOUT = 30.0
TENANT = "t1"


@pytest.fixture
def hasher() -> IdentityHasher:
    return IdentityHasher(SECRET.encode())


@pytest.fixture
def workers(db_url: str) -> Iterator[Spawn]:
    """Start worker processes on the test's database; all are killed at the end."""
    started: list[WorkerProcess] = []

    def spawn(
        job: str,
        operation: str,
        *,
        gates: Sequence[str] = (),
        claim: str = "key",
        **options: object,
    ) -> WorkerProcess:
        args = ["--database-url", db_url, "--job", job, "--tenant", TENANT]
        args += ["--operation", operation, "--lease", str(LEASE_SECONDS), "--claim", claim]
        for gate in gates:
            args += ["--gate", gate]
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        worker = WorkerProcess(args, {IDENTITY_KEY_ENV: SECRET})
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.close()


def ingest(
    store: PostgresStore,
    job: str,
    target_class: TargetClass,
    operation: str,
    payload: dict[str, object],
    *,
    max_attempts: int = 5,
) -> Key:
    store.inbox.ingest(
        [
            Delivery(
                tenant_id=TENANT,
                operation_id=operation,
                subscription="seed",
                job_type=job,
                target_class=target_class,
                payload=json.dumps(payload).encode(),
                max_attempts=max_attempts,
            )
        ]
    )
    return Key(TENANT, operation)


def work_row(db: Db, key: Key) -> dict[str, Any]:
    cur = db.execute(
        "SELECT state, fence, attempts, outcome_code, outcome_detail, intent_fence"
        "  FROM work_item WHERE tenant_id = %s AND operation_id = %s",
        (key.tenant_id, key.operation_id),
    )
    row = cur.fetchone()
    assert row is not None
    return dict(zip([c.name for c in cur.description or ()], row, strict=True))


def wait_for_lapse(db: Db, key: Key) -> None:
    """Poll until the row's lease has expired by the database clock."""
    deadline = time.monotonic() + LAPSE_TIMEOUT
    while True:
        row = db.execute(
            "SELECT state = 'claimed' AND lease_expires_at < now() FROM work_item"
            " WHERE tenant_id = %s AND operation_id = %s",
            (key.tenant_id, key.operation_id),
        ).fetchone()
        if row is not None and row[0]:
            return
        assert time.monotonic() < deadline, "the lease did not lapse"
        time.sleep(0.05)


# -- seed test 1: pause after claim, past lease expiry ------------------------------------------


@pytest.mark.promise("worker-fault")
def test_class_a_worker_paused_after_claim_cannot_commit_after_a_takeover(
    db: Db, store: PostgresStore, workers: Spawn
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, TENANT, "inv-1", amount=1200)
    key = ingest(store, invoices.JOB_TYPE, TargetClass.A, "refund-1", {"invoice_id": "inv-1"})

    stale = workers(invoices.JOB_TYPE, "refund-1", gates=["claimed"])
    assert stale.claimed() == Claimed(fence=1, attempts=1, takeover=False)
    stale.at("claimed")
    stale.pause()
    wait_for_lapse(db, key)

    winner = workers(invoices.JOB_TYPE, "refund-1")
    assert winner.claimed() == Claimed(fence=2, attempts=2, takeover=True)
    assert winner.result() == {"settled.succeeded": 1}

    stale.resume()
    stale.go()
    assert stale.result() == {"lease_lost": 1}
    assert not stale.reached("handler"), "refused at the fenced lock, before the handler ran"

    refunded = invoices.find_invoice(db, TENANT, "inv-1")
    assert refunded is not None
    assert (refunded.status, refunded.refunded_fence) == ("refunded", 2)
    row = work_row(db, key)
    assert (row["state"], row["fence"], row["outcome_code"]) == ("succeeded", 2, "refunded")


@pytest.mark.slow
def test_class_b_worker_paused_after_claim_is_fenced_out_by_the_target(
    db: Db, store: PostgresStore, workers: Spawn
) -> None:
    balances.install(db)
    request = {"account_id": "acc-1", "balance": 15000, "currency": "eur"}
    key = ingest(store, balances.JOB_TYPE, TargetClass.B, "balance-1", request)

    stale = workers(balances.JOB_TYPE, "balance-1", gates=["claimed"])
    assert stale.claimed() == Claimed(fence=1, attempts=1, takeover=False)
    stale.at("claimed")
    stale.pause()
    wait_for_lapse(db, key)

    winner = workers(balances.JOB_TYPE, "balance-1")
    assert winner.claimed() == Claimed(fence=2, attempts=2, takeover=True)
    assert winner.result() == {"settled.succeeded": 1}

    stale.resume()
    stale.go()
    assert stale.result() == {"fenced_out": 1}
    assert stale.reached("handler")
    assert not stale.reached("effect"), "refused inside the write itself"

    written = balances.find_balance(db, TENANT, "balance-1")
    assert written is not None
    assert (written.balance, written.last_fence, written.writes) == (15000, 2, 1)
    row = work_row(db, key)
    assert (row["state"], row["fence"], row["outcome_code"]) == ("succeeded", 2, "balance_set")


@pytest.mark.slow
def test_class_a_worker_paused_inside_its_transaction_keeps_the_row_and_commits_once(
    db: Db, store: PostgresStore, workers: Spawn
) -> None:
    invoices.install(db)
    invoices.add_invoice(db, TENANT, "inv-1", amount=1200)
    key = ingest(store, invoices.JOB_TYPE, TargetClass.A, "refund-1", {"invoice_id": "inv-1"})

    holder = workers(invoices.JOB_TYPE, "refund-1", gates=["effect"])
    assert holder.claimed() == Claimed(fence=1, attempts=1, takeover=False)
    holder.at("effect")  # refund written inside the transaction, not committed
    holder.pause()
    wait_for_lapse(db, key)

    rivals = {
        claim: workers(invoices.JOB_TYPE, "refund-1", claim=claim) for claim in ("key", "any")
    }
    for claim, rival in rivals.items():
        assert rival.claimed() is None, f"a {claim} claim took a locked row over"
        assert rival.finished() == 0
    assert store.settle.sweep() == Swept([], [])
    uncommitted = invoices.find_invoice(db, TENANT, "inv-1")
    assert uncommitted is not None
    assert uncommitted.status == "paid"

    holder.resume()
    holder.go()
    assert holder.result() == {"settled.succeeded": 1}

    refunded = invoices.find_invoice(db, TENANT, "inv-1")
    assert refunded is not None
    assert (refunded.status, refunded.refunded_fence) == ("refunded", 1)
    row = work_row(db, key)
    assert (row["state"], row["fence"], row["attempts"]) == ("succeeded", 1, 1)
    later = workers(invoices.JOB_TYPE, "refund-1")
    assert later.claimed() is None


# -- seed test 2: crash after the external call, before completion ------------------------------


@pytest.mark.slow
@pytest.mark.promise("worker-fault")
def test_class_c_worker_killed_after_the_charge_is_reconciled_without_a_second_charge(
    db: Db, store: PostgresStore, workers: Spawn, hasher: IdentityHasher
) -> None:
    charge = {"amount": 1200, "currency": "eur", "reference": "order-1"}
    key = ingest(store, payments.JOB_TYPE, TargetClass.C, "charge-1", charge)
    idempotency_key = hasher.idempotency_key(TENANT, "charge-1")

    with PaymentProvider() as provider:
        crashed = workers(
            payments.JOB_TYPE, "charge-1", gates=["effect"], provider_url=provider.url
        )
        assert crashed.claimed() == Claimed(fence=1, attempts=1, takeover=False)
        crashed.at("effect")
        assert provider.charges_for(idempotency_key) == 1
        crashed.kill()
        assert work_row(db, key)["state"] == "claimed"
        wait_for_lapse(db, key)

        successor = workers(payments.JOB_TYPE, "charge-1", provider_url=provider.url)
        assert successor.claimed() == Claimed(fence=2, attempts=2, takeover=True)
        assert successor.result() == {"reconciled.applied": 1, "settled.succeeded": 1}
        assert not successor.reached("handler"), "the lookup found the charge: no second POST"

        assert provider.charges_for(idempotency_key) == 1
        assert provider.requests_for(idempotency_key) == 1
        assert provider.lookups_for(idempotency_key) == 1
        (only,) = provider.ledger()
    row = work_row(db, key)
    assert (row["state"], row["fence"], row["outcome_detail"]) == ("succeeded", 2, only.id)


# -- class D: crash after the call --------------------------------------------------------------


@pytest.mark.slow
def test_class_d_worker_killed_after_its_call_is_parked_unknown_and_never_called_again(
    db: Db, store: PostgresStore, workers: Spawn, tmp_path: Path
) -> None:
    sink = tmp_path / "sink.log"
    key = ingest(store, NOTIFY_JOB, TargetClass.D, "notify-1", {"to": "ops"}, max_attempts=1)

    crashed = workers(NOTIFY_JOB, "notify-1", gates=["effect"], sink=sink)
    assert crashed.claimed() == Claimed(fence=1, attempts=1, takeover=False)
    crashed.at("effect")
    crashed.kill()
    assert sink.read_text().splitlines() == [f"{TENANT} notify-1 fence=1"]
    wait_for_lapse(db, key)

    assert store.settle.sweep() == Swept([Ticket(TENANT, "notify-1", 1)], [])
    row = work_row(db, key)
    assert (row["state"], row["outcome_code"], row["intent_fence"]) == (
        State.UNKNOWN,
        "lease_expired_attempts_exhausted",
        1,
    )

    moved = store.operator.redrive(
        RedriveFilter(keys=(key,)), actor="on-call", reason="reconcile the notification"
    )
    assert [(m.key, m.from_state) for m in moved] == [(key, State.UNKNOWN)]
    again = workers(NOTIFY_JOB, "notify-1", sink=sink)
    assert again.claimed() == Claimed(fence=2, attempts=2, takeover=False)
    assert again.result() == {"settled.unknown": 1}
    assert not again.reached("handler")

    row = work_row(db, key)
    assert (row["state"], row["outcome_code"]) == (State.UNKNOWN, "intent_recorded")
    assert sink.read_text().splitlines() == [f"{TENANT} notify-1 fence=1"], "called exactly once"


@pytest.mark.slow
def test_class_d_worker_killed_before_its_intent_is_queued_again_and_called_once(
    db: Db, store: PostgresStore, workers: Spawn, tmp_path: Path
) -> None:
    sink = tmp_path / "sink.log"
    key = ingest(store, NOTIFY_JOB, TargetClass.D, "notify-1", {"to": "ops"}, max_attempts=1)

    crashed = workers(NOTIFY_JOB, "notify-1", gates=["claimed"], sink=sink)
    assert crashed.claimed() == Claimed(fence=1, attempts=1, takeover=False)
    crashed.at("claimed")  # claimed, nothing recorded, nothing called
    crashed.kill()
    wait_for_lapse(db, key)

    # No intent: the target was never called, so the sweeper sends the row back to the queue.
    assert store.settle.sweep() == Swept([], [Ticket(TENANT, "notify-1", 1)])
    row = work_row(db, key)
    assert (row["state"], row["outcome_code"], row["intent_fence"]) == (
        State.QUEUED,
        "lease_expired_not_started",
        None,
    )
    again = workers(NOTIFY_JOB, "notify-1", sink=sink)
    assert again.claimed() == Claimed(fence=2, attempts=2, takeover=False)
    assert again.result() == {"settled.succeeded": 1}
    assert work_row(db, key)["state"] == State.SUCCEEDED
    assert sink.read_text().splitlines() == [f"{TENANT} notify-1 fence=2"], "called exactly once"
