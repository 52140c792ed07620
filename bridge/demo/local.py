"""``fencebridge demo --local``: what a laptop lacks to run a team's own bridge, in one command.

An embedded PostgreSQL (migrated), a local SQS (moto) with the queue ``refunds`` and, when
Google's Pub/Sub emulator is installed, the emulator with the topic and subscription
``ledger``; an env file (``local.env``: the database URL, a fresh identity key, the endpoints
and credentials) and a configuration (``bridge.toml``) wiring both to the tutorial's handlers
(docs/tutorial.md). Everything runs until SIGINT or SIGTERM, then stops (exit 0).
"""

from __future__ import annotations

import secrets
import signal
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from bridge import embedded
from bridge.database import DATABASE_URL_ENV, connect
from bridge.demo.emulator import EMULATOR_HOST_ENV, PubSubEmulator, find_launcher
from bridge.demo.scenario import SQS_CREDENTIALS
from bridge.identity import IDENTITY_KEY_ENV
from bridge.store.migrate import migrate

REGION = "us-east-1"
DECODE = """tenant_id = "attribute:tenant"
operation_id = "attribute:operation"
job_type = "attribute:type"
payload = "body"
"""


def run(directory: Path, out: Callable[[str], None] = print) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ExitStack() as stack:
            env, config = _start(stack, directory, out)
            (directory / "local.env").write_text(
                "".join(f"export {k}={v}\n" for k, v in env.items()), encoding="utf-8"
            )
            (directory / "bridge.toml").write_text(config, encoding="utf-8")
            out(f"wrote {directory / 'local.env'} and {directory / 'bridge.toml'}")
            out(f"ready: `. {directory / 'local.env'}` in another shell; Ctrl-C stops everything")
            stop.wait()
        out("stopped")
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _start(
    stack: ExitStack, directory: Path, out: Callable[[str], None]
) -> tuple[dict[str, str], str]:
    import boto3  # noqa: PLC0415  (the demo extra)
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    database = embedded.start(directory / "postgres")
    stack.callback(database.stop)
    with connect(database.url) as conn:
        migrate(conn)
    out(f"PostgreSQL: {database.url}")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    stack.callback(moto.stop)
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    sqs = boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=SQS_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=SQS_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    queue_url = sqs.create_queue(QueueName="refunds")["QueueUrl"]
    out(f"SQS (moto): {endpoint}, queue {queue_url}")
    env = {
        DATABASE_URL_ENV: database.url,
        # the tutorial's class B ledger keeps its table in the same database
        "LEDGER_DATABASE_URL": database.url,
        IDENTITY_KEY_ENV: secrets.token_hex(32),
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_SQS": endpoint,
        "REFUNDS_QUEUE_URL": queue_url,
        **SQS_CREDENTIALS,
    }
    config = (
        '[jobs.refund]\nhandler = "refunds:RefundHandler"\ntarget_class = "C"\n'
        'owner = "payments"\n\n'
        f'[subscriptions.refunds]\nsource = "sqs"\nqueue_url = "{queue_url}"\n'
        f'endpoint_url = "{endpoint}"\nregion = "{REGION}"\njob_types = ["refund"]\n\n'
        f"[subscriptions.refunds.decode]\n{DECODE}"
    )
    launcher, why = find_launcher()
    if launcher is None:
        out(f"Pub/Sub emulator: not started ({why})")
        return env, config
    emulator = PubSubEmulator(launcher)
    emulator.start()
    stack.callback(emulator.stop)
    topic, subscription = emulator.create("ledger", ack_deadline=30)
    out(f"Pub/Sub emulator: {emulator.host}, topic {topic}, subscription {subscription}")
    env[EMULATOR_HOST_ENV] = emulator.host
    env["LEDGER_TOPIC"] = topic
    config += (
        '\n[jobs.ledger]\nhandler = "ledger:LedgerHandler"\ntarget_class = "B"\n'
        'owner = "finance"\n\n'
        f'[subscriptions.ledger]\nsource = "pubsub"\nsubscription = "{subscription}"\n'
        f'job_types = ["ledger"]\n\n[subscriptions.ledger.decode]\n{DECODE}'
    )
    return env, config
