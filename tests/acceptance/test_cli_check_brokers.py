"""``fencebridge check`` asks the brokers: each subscription's queue (moto's SQS, over HTTP) or
subscription (the Pub/Sub emulator, over gRPC) must exist, and its settings are read and judged;
the headline counts what was executed, never "all hold" over a control that was not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.database import DATABASE_URL_ENV
from tests.support.bridge_process import (
    AWS_ENV,
    BridgeProcess,
    Job,
    SqsBridgeConfig,
    bridge_env,
)
from tests.support.pubsub_emulator import (
    EMULATOR_HOST_ENV,
    PubSubEmulator,
    pubsub_emulator,
    require_launcher,
)
from tests.support.sqs_server import SqsServer, sqs_server

ROOT = Path(__file__).resolve().parents[2]
JOB = (
    '[jobs.sms]\nhandler = "tests.acceptance.test_cli_check:Sms"\ntarget_class = "D"\n'
    'owner = "messaging"\n\n[retention]\npurge_after_days = 40\ntombstone_days = 400\n'
    'erasure_owner = "privacy-office"\n'
)
DECODE = (
    'tenant_id = "attribute:tenant"\noperation_id = "body:/id"\njob_type = "attribute:type"\n'
    'payload = "body:/data"\n'
)


def sqs_config(endpoint: str, queue_url: str) -> str:
    return (
        f'{JOB}\n[subscriptions.orders]\nsource = "sqs"\nqueue_url = "{queue_url}"\n'
        f'endpoint_url = "{endpoint}"\nregion = "us-east-1"\njob_types = ["sms"]\n\n'
        f"[subscriptions.orders.decode]\n{DECODE}"
    )


def pubsub_config(path: str) -> str:
    return (
        f'{JOB}\n[subscriptions.events]\nsource = "pubsub"\nsubscription = "{path}"\n'
        f'job_types = ["sms"]\n\n[subscriptions.events.decode]\n{DECODE}'
    )


def check(text: str, db_url: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "check", "--config", str(path)],
        env={**base, **AWS_ENV, DATABASE_URL_ENV: db_url, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def moto() -> Iterator[SqsServer]:
    with sqs_server() as server:
        yield server


@pytest.fixture(scope="module")
def emulator() -> Iterator[PubSubEmulator]:
    with pubsub_emulator(require_launcher()) as running:
        yield running


def test_a_missing_queue_is_no_go_naming_it(moto: SqsServer, db_url: str, tmp_path: Path) -> None:
    missing = f"{moto.endpoint}/123456789012/no-such-queue"
    done = check(sqs_config(moto.endpoint, missing), db_url, tmp_path)
    assert done.returncode == 1, done.stdout
    assert f"orders: queue {missing} does not exist" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("NO-GO: 1 control(s) fail (sms: 8)")


def test_an_existing_queue_is_read_and_its_missing_dlq_is_a_warning(
    moto: SqsServer, db_url: str, tmp_path: Path
) -> None:
    queue = moto.create_queue("plain")
    done = check(sqs_config(moto.endpoint, queue), db_url, tmp_path)
    assert done.returncode == 0, done.stdout
    assert f"queue {queue} exists: standard" in done.stdout
    assert f"warning: orders: queue {queue} has no redrive policy" in done.stdout
    last = done.stdout.splitlines()[-1]
    assert last == "GO for 1 job type(s): 6 held, 3 not probed (control(s) 3, 4, 8); 1 warning(s)"
    assert "all 9" not in done.stdout


def test_a_queue_with_a_dead_letter_queue_has_no_warning(
    moto: SqsServer, db_url: str, tmp_path: Path
) -> None:
    dlq = moto.create_queue("dlq")
    arn = moto.client().get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])
    policy = json.dumps(
        {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": 5}
    )
    queue = moto.create_queue("redriven", RedrivePolicy=policy)
    done = check(sqs_config(moto.endpoint, queue), db_url, tmp_path)
    assert done.returncode == 0, done.stdout
    assert "after 5 receives" in done.stdout
    assert "warning" not in done.stdout


def test_a_broker_that_cannot_be_asked_leaves_control_8_not_probed(
    db_url: str, tmp_path: Path
) -> None:
    endpoint = "http://127.0.0.1:9"
    done = check(sqs_config(endpoint, f"{endpoint}/123456789012/orders"), db_url, tmp_path)
    assert done.returncode == 0, done.stdout
    assert "orders: broker not probed (SQS at" in done.stdout
    assert "3 not probed (control(s) 3, 4, 8)" in done.stdout.splitlines()[-1]


@pytest.mark.slow  # the emulator's start
def test_a_missing_subscription_is_no_go_naming_it(
    emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    missing = "projects/fencebridge-local/subscriptions/no-such-subscription"
    done = check(pubsub_config(missing), db_url, tmp_path, **{EMULATOR_HOST_ENV: emulator.host})
    assert done.returncode == 1, done.stdout
    assert f"events: subscription {missing} does not exist" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("NO-GO: 1 control(s) fail (sms: 8)")


@pytest.mark.slow  # the emulator's start
def test_an_existing_subscription_is_read_and_judged(
    emulator: PubSubEmulator, db_url: str, tmp_path: Path
) -> None:
    _, path = emulator.create(enable_exactly_once_delivery=True, ack_deadline=5)
    done = check(pubsub_config(path), db_url, tmp_path, **{EMULATOR_HOST_ENV: emulator.host})
    assert done.returncode == 0, done.stdout
    assert f"subscription {path} exists: exactly-once on, ack deadline 5 s" in done.stdout
    assert f"warning: events: subscription {path}: ack deadline 5 s" in done.stdout
    assert f"warning: events: subscription {path} has no dead-letter policy" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("; 2 warning(s)")


@pytest.mark.slow
def test_runs_warning_about_a_missing_queue_names_it(
    moto: SqsServer, db_url: str, tmp_path: Path
) -> None:
    """What ``check`` says before, ``run`` says while it retries: which queue it tried."""
    missing = f"{moto.endpoint}/123456789012/no-such-queue"
    config = SqsBridgeConfig(
        queue_url=missing,
        endpoint_url=moto.endpoint,
        jobs={"record": Job("tests.support.handlers:RecordEffect", "A")},
    )
    with BridgeProcess.start(config, tmp_path, bridge_env(db_url)) as bridge:
        bridge.wait_log(f"receive from SQS queue {missing} failed")
        assert bridge.terminate() == 0, bridge.logs()
