"""A deployment's identity key on its first day: ``fencebridge run`` never records a key by
itself, ``fencebridge identity init`` records it on purpose (its fingerprint at WARNING, with
what it means), and ``fencebridge identity reset`` replaces a key recorded by mistake, audited,
only while nothing was written under it.

Each command runs as a subprocess against PostgreSQL; the bridge against moto's SQS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bridge import keyring
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher, fingerprint, shown
from bridge.store import PostgresStore
from tests.support.bridge_process import (
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
    fencebridge,
    run_to_exit,
)
from tests.support.deliveries import delivery
from tests.support.sqs_server import SqsServer, sqs_server

THROWAWAY = "a-throwaway-key-typed-on-day-one-0000"
REAL = "the-deployments-real-identity-key-0001"


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


def keys(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key_id, fingerprint FROM identity_key ORDER BY 1").fetchall()
    return [(int(k), str(f)) for k, f in rows]


@pytest.mark.slow
@pytest.mark.promise("identity-key")
def test_run_refuses_a_database_with_no_key_until_identity_init_records_it(
    tmp_path: Path, moto: SqsServer, db_url: str
) -> None:
    config = SqsBridgeConfig(
        queue_url=moto.create_queue("first-day"),
        endpoint_url=moto.endpoint,
        jobs={"record": Job("tests.support.handlers:RecordEffect", "A")},
    )
    env = bridge_env(db_url, identity_key=THROWAWAY)
    refused = run_to_exit(config.write(tmp_path), env)
    assert refused.returncode == 1, refused.stderr
    assert "fencebridge run: no identity key is recorded" in refused.stderr
    assert "fencebridge identity init" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert THROWAWAY not in refused.stdout + refused.stderr
    assert keys(db_url) == [], "a start that refused recorded nothing"

    env = bridge_env(db_url, identity_key=REAL)
    done = fencebridge(env, "identity", "init", "--reason", "first deployment")
    assert done.returncode == 0, done.stderr
    printed = shown(fingerprint(REAL.encode()))
    assert f"recorded key 1 (fingerprint {printed})" in done.stdout
    assert "every idempotency key" in done.stdout
    warning = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warning) == 1, done.stderr
    assert printed in warning[0]
    assert "identity reset" in warning[0]
    assert REAL not in done.stdout + done.stderr
    assert keys(db_url) == [(1, fingerprint(REAL.encode()))]

    again = fencebridge(env, "identity", "init", "--reason", "again")
    assert again.returncode == 0, again.stderr
    assert "already recorded: nothing changed" in again.stdout
    other = fencebridge(
        bridge_env(db_url, identity_key=THROWAWAY), "identity", "init", "--reason", "oops"
    )
    assert other.returncode == 1
    assert "identity reset" in other.stderr
    assert keys(db_url) == [(1, fingerprint(REAL.encode()))]

    with BridgeProcess.start(config, tmp_path, env) as bridge:
        bridge.wait_ready()
        assert bridge.terminate() == 0, bridge.logs()


@pytest.mark.slow
@pytest.mark.promise("identity-key")
def test_a_key_recorded_by_mistake_is_reset_while_unused_and_the_reset_is_audited(
    db_url: str,
) -> None:
    throwaway = bridge_env(db_url, identity_key=THROWAWAY)
    assert fencebridge(throwaway, "identity", "init", "--reason", "tried it").returncode == 0
    real = bridge_env(db_url, identity_key=REAL)
    refused = fencebridge(real, "status")
    assert refused.returncode == 1
    assert "not a key this database was written under" in refused.stderr

    dry = fencebridge(real, "identity", "reset", "--reason", "CHG-7 real key", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing was changed" in dry.stdout
    assert keys(db_url) == [(1, fingerprint(THROWAWAY.encode()))]

    done = fencebridge(real, "identity", "reset", "--reason", "CHG-7 real key", "--actor", "ana")
    assert done.returncode == 0, done.stderr
    assert "replaced key 1" in done.stdout
    assert any(
        " WARNING " in line and "identity key reset" in line for line in done.stderr.splitlines()
    )
    assert keys(db_url) == [(1, fingerprint(REAL.encode()))]
    with psycopg.connect(db_url) as conn:
        audit = conn.execute(
            "SELECT actor, reason, replaced_fingerprint, fingerprint FROM identity_key_reset"
        ).fetchall()
    assert audit == [
        ("ana", "CHG-7 real key", fingerprint(THROWAWAY.encode()), fingerprint(REAL.encode()))
    ]
    assert fencebridge(real, "status").returncode == 0


def write_work_row(url: str) -> None:
    store = PostgresStore.connect(url, max_size=2)
    try:
        keyring.attach(
            store.keys, IdentityHasher(THROWAWAY.encode()), used_by="test", first_use=False
        )
        store.inbox.ingest([delivery("op-1")])
    finally:
        store.close()


def write_tombstone(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO erased_operation (key_id, operation_hash, tenant_hash, payload_hash,"
            " state, erasure_id) VALUES (1, %s, 't_x', %s, 'succeeded', 1)",
            (b"\x01" * 32, b"\x02" * 32),
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("write", "named"),
    [(write_work_row, "work rows or intents"), (write_tombstone, "tombstones")],
    ids=["work-row", "tombstone"],
)
def test_a_reset_is_refused_once_anything_was_written_under_the_key(
    db_url: str, write: object, named: str
) -> None:
    throwaway = bridge_env(db_url, identity_key=THROWAWAY)
    assert fencebridge(throwaway, "identity", "init", "--reason", "tried it").returncode == 0
    assert callable(write)
    write(db_url)
    real = bridge_env(db_url, identity_key=REAL)
    refused = fencebridge(real, "identity", "reset", "--reason", "too late")
    assert refused.returncode == 1, refused.stdout
    assert f"{named} were written under it" in refused.stderr
    assert "fencebridge identity rotate" in refused.stderr
    assert keys(db_url) == [(1, fingerprint(THROWAWAY.encode()))]


@pytest.mark.slow
def test_a_reset_is_refused_while_another_fencebridge_session_is_connected(db_url: str) -> None:
    throwaway = bridge_env(db_url, identity_key=THROWAWAY)
    assert fencebridge(throwaway, "identity", "init", "--reason", "tried it").returncode == 0
    with psycopg.connect(db_url, application_name="fencebridge"):
        refused = fencebridge(
            bridge_env(db_url, identity_key=REAL), "identity", "reset", "--reason", "busy"
        )
    assert refused.returncode == 1
    assert "1 other fencebridge session(s)" in refused.stderr
    assert IDENTITY_KEY_ENV not in refused.stdout
