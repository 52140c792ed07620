"""``fencebridge rate-wait`` as an operator runs it: list the waits, lift one, audited.

The waits are put in place with the store the way a handler's ``RateLimited`` leaves them
(a claimed row refused by its target for an hour); the command runs as a real process on the
same database, with the deployment's identity key, and shows tenants by keyed hash only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from bridge.operator.rate_waits import LIFTED_MARK
from bridge.store import PostgresStore
from bridge.types import Key
from tests.acceptance.test_cli_operations import HASHER, cli
from tests.support.deliveries import delivery

__all__ = ["cli"]  # the fixture, imported for these tests

LEASE = timedelta(seconds=60)
ALPHA, BETA = "tenant-alpha", "tenant-beta"

Db = psycopg.Connection[Any]


def limited(store: PostgresStore, tenant: str, op: str, wait: timedelta) -> None:
    """A row its target refused for ``wait``: the row and its job type and tenant wait."""
    (claim,) = store.claims.claim_keys("worker-1", [Key(tenant, op)], LEASE)
    store.settle.rate_limited(claim.ticket, wait)


@pytest.mark.slow
def test_rate_wait_lists_the_waits_and_clear_lifts_one_audited(
    cli: Any, store: PostgresStore, db: Db
) -> None:
    store.inbox.ingest([delivery(op, tenant=ALPHA) for op in ("a-1", "a-2")])
    store.inbox.ingest([delivery("b-1", tenant=BETA)])
    limited(store, ALPHA, "a-1", timedelta(hours=2))
    limited(store, BETA, "b-1", timedelta(hours=1))

    listed = cli("rate-wait", "list").stdout
    lines = listed.splitlines()
    assert lines[0].split() == ["job_type", "tenant", "until", "queued"]
    assert [line.split()[:2] + line.split()[3:] for line in lines[1:]] == [
        ["refund", HASHER.tenant(ALPHA), "2"],
        ["refund", HASHER.tenant(BETA), "1"],
    ]
    assert ALPHA not in listed
    assert BETA not in listed

    args = ("rate-wait", "clear", "--job-type", "refund", "--tenant", ALPHA)
    dry = cli(*args, "--reason", "INC-9 limit raised", "--dry-run").stdout
    assert "would lift 1 wait(s); 1 row(s) due now" in dry
    assert "dry run: nothing was written" in dry
    assert db.execute("SELECT count(*) FROM rate_wait").fetchone() == (2,)

    done = cli(*args, "--reason", "INC-9 limit raised", "--actor", "alice").stdout
    assert "lifted 1 wait(s); 1 row(s) due now, each audited" in done
    assert HASHER.tenant(ALPHA) in done
    assert ALPHA not in done
    claimed = {c.operation_id for c in store.claims.claim("worker-2", 10, LEASE)}
    assert claimed == {"a-1", "a-2"}  # the beta tenant's wait is still on
    audit = db.execute(
        "SELECT operation_id, actor, reason, from_state, to_state FROM redrive_audit"
    ).fetchall()
    assert audit == [("a-1", "alice", f"INC-9 limit raised {LIFTED_MARK}", "queued", "queued")]

    again = cli(*args, "--reason", "INC-9", check=False)
    assert again.returncode == 1
    assert "nothing lifted" in again.stdout
    unreasoned = cli("rate-wait", "clear", "--job-type", "refund", check=False)
    assert unreasoned.returncode == 2
    assert "--reason" in unreasoned.stderr
