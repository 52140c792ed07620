"""``fencebridge demo``: the whole protocol on a laptop, with nothing to configure.

It starts an embedded PostgreSQL, a local broker (an SQS server from moto, or Google's Pub/Sub
emulator with ``--broker pubsub``) and the example payment provider,
then runs the bridge with the class C example handler and publishes a batch that holds the
awkward cases: the same delivery twice, a changed payload under an existing operation id,
messages the rules cannot decode, two tenants that use the same operation ids, a charge whose
response is lost after the provider applied it, and a worker that stalls past its lease after
charging. It prints a live progress line, then a summary, and checks the one thing that
matters: the provider's ledger holds exactly one charge per operation that succeeded, and none
twice.

With ``keep`` it then writes its configuration and an env file (:mod:`bridge.demo.explore`),
prints the commands to try and keeps everything running until SIGINT or SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from bridge import embedded
from bridge.config import load_config, parse_config
from bridge.database import DATABASE_URL_ENV, connect
from bridge.demo import explore
from bridge.demo.emulator import EMULATOR_HOST_ENV, PubSubEmulator, find_launcher
from bridge.demo.payments import JOB_TYPE, PROVIDER_URL_ENV, ChargeCustomer
from bridge.demo.provider import FaultKind, PaymentClient, PaymentProvider
from bridge.errors import ConfigError
from bridge.handlers import Context, Success
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.runtime.process import Bridge, build_registry
from bridge.store import PostgresStore
from bridge.store.migrate import migrate
from bridge.types import State

TENANTS = ("acme", "globex")
ORDERS = 10
LEASE_SECONDS = 2
DEADLINE_SECONDS = 50
STALL_REFERENCE = "stall-past-the-lease"

CONFIG = """\
# The configuration `fencebridge demo` runs. The demo itself runs a variant of the handler
# whose first attempt on one operation stalls past its lease after charging. Secrets and
# endpoints outside this file come from the environment (demo.env beside it).

[bridge]
worker_id = "demo"
worker_threads = 4
poll_interval_seconds = 0.2
sweep_interval_seconds = 1.0
shutdown_deadline_seconds = 5.0
health_port = 0

[jobs.{job_type}]
handler = "bridge.demo.payments:ChargeCustomer"
target_class = "C"
max_attempts = 5
lease_seconds = {lease}
backoff_initial_seconds = 0.2
backoff_max_seconds = 1.0
owner = "payments-oncall"

[subscriptions.payments]
{source}
job_types = ["{job_type}"]

[subscriptions.payments.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:{job_type}"
payload = "body"

[retention]
purge_after_days = 90
erasure_owner = "privacy-office"
"""

#: moto accepts any credentials; boto3 and the aws CLI only need some to sign with
SQS_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"}

EMULATOR_HINT = (
    "the Pub/Sub demo needs Google's Pub/Sub emulator and Java: install the Cloud CLI "
    "component (`gcloud components install pubsub-emulator`, or the Debian package "
    "google-cloud-cli-pubsub-emulator) and a Java 17 runtime, or set "
    "FENCEBRIDGE_PUBSUB_EMULATOR to the emulator's launcher"
)


class DemoBroker(Protocol):
    """**Protocol**: the local broker the demo publishes to."""

    #: the consumer counter that says a delivery was acknowledged
    acked_counter: str

    def source(self) -> str:
        """The subscription's source keys, as TOML lines."""
        ...

    def env(self) -> dict[str, str]:
        """What a shell needs to reach this broker, for the env file."""
        ...

    def describe(self) -> str:
        """One line for the operator: what runs where."""
        ...

    def send(self, body: str, **attributes: str) -> None: ...


@dataclass
class LocalSqs:
    client: Any
    endpoint: str
    queue_url: str
    acked_counter: str = "deleted"

    def source(self) -> str:
        return (
            f'source = "sqs"\nqueue_url = "{self.queue_url}"\nregion = "us-east-1"\n'
            f'endpoint_url = "{self.endpoint}"\nwait_seconds = 1'
        )

    def env(self) -> dict[str, str]:
        return {
            **SQS_CREDENTIALS,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_SQS": self.endpoint,
        }

    def describe(self) -> str:
        return f"SQS (moto) at {self.endpoint}, queue {self.queue_url}"

    def send(self, body: str, **attributes: str) -> None:
        self.client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body,
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
            },
        )


@dataclass
class LocalPubSub:
    emulator: PubSubEmulator
    topic: str
    subscription: str
    acked_counter: str = "acked"

    def source(self) -> str:
        return f'source = "pubsub"\nsubscription = "{self.subscription}"'

    def env(self) -> dict[str, str]:
        return {EMULATOR_HOST_ENV: self.emulator.host}

    def describe(self) -> str:
        return (
            f"Pub/Sub emulator at {self.emulator.host}, topic {self.topic}, "
            f"subscription {self.subscription}"
        )

    def send(self, body: str, **attributes: str) -> None:
        self.emulator.publish(self.topic, body.encode(), **attributes)


class StallingCharge(ChargeCustomer):
    """The example handler, except that one operation's first attempt charges and then stalls.

    It stops reporting progress, so its lease is not renewed; another worker takes the row over
    under a higher fence and reconciles by lookup. When the stalled attempt wakes up and tries
    to record its success, the fence refuses it.
    """

    def __init__(self, client: PaymentClient, taken_over: threading.Event) -> None:
        super().__init__(client)
        self._taken_over = taken_over
        self.stalled = threading.Event()

    def perform(self, ctx: Context, key: str) -> Success:
        result = super().perform(ctx, key)
        if ctx.attempt == 1 and json.loads(ctx.payload).get("reference") == STALL_REFERENCE:
            self.stalled.set()
            self._taken_over.wait(timeout=LEASE_SECONDS * 10)
        return result


@dataclass
class Published:
    """What the batch holds: deliveries sent, operations they make, and how many are charges.

    An operation is a decodable ``(tenant, operation id)``, whatever its payload: the message
    whose body is not JSON still becomes a work row (the rules take the body as it is), and its
    handler quarantines it. So there is one operation more than there are charges.
    """

    deliveries: int = 0
    operations: int = 0
    charges: int = 0


def publish(broker: DemoBroker) -> Published:
    """The demo batch; returns what it holds."""
    sent = Published()

    def charge(tenant: str, op: str, amount: int, reference: str | None = None) -> None:
        body = {"amount": amount, "currency": "eur", "reference": reference or op}
        broker.send(json.dumps(body), tenant_id=tenant, operation_id=op)
        sent.deliveries += 1

    def new_charge(tenant: str, op: str, amount: int, reference: str | None = None) -> None:
        charge(tenant, op, amount, reference)
        sent.operations += 1
        sent.charges += 1

    for tenant in TENANTS:  # the same operation ids in both tenants: different operations
        for i in range(1, ORDERS + 1):
            new_charge(tenant, f"order-{i}", 1000 + i)
    for i in (2, 4, 6):  # redelivered or resent: replays
        charge("acme", f"order-{i}", 1000 + i)
    charge("globex", "order-5", 99_999)  # same operation id, changed amount: conflict
    broker.send('{"amount": 1, "currency": "eur"}', operation_id="no-tenant")  # undecodable
    broker.send("this is not JSON", tenant_id="acme", operation_id="order-x")  # a new operation
    sent.deliveries += 2
    sent.operations += 1
    new_charge("acme", "order-stall", 4200, STALL_REFERENCE)  # charges, then stalls past lease
    return sent


@dataclass
class Services:
    """What the demo runs beside the bridge: a database, a broker and a payment provider."""

    database: embedded.EmbeddedPostgres
    broker: DemoBroker
    provider: PaymentProvider


def _env(stack: ExitStack, **values: str) -> None:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    stack.callback(restore)


def _start_sqs(stack: ExitStack) -> LocalSqs:
    try:
        import boto3  # noqa: PLC0415
        from moto.server import ThreadedMotoServer  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            "the demo needs a local SQS server: pip install 'fencebridge[demo]'"
        ) from exc
    _env(stack, **SQS_CREDENTIALS)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    stack.callback(moto.stop)
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("sqs", region_name="us-east-1", endpoint_url=endpoint)
    queue_url = client.create_queue(QueueName="payments", Attributes={"VisibilityTimeout": "10"})[
        "QueueUrl"
    ]
    return LocalSqs(client, endpoint, queue_url)


def _start_pubsub(stack: ExitStack) -> LocalPubSub:
    launcher, why = find_launcher()
    if launcher is None:
        raise ConfigError(f"{EMULATOR_HINT} ({why})")
    emulator = PubSubEmulator(launcher)
    emulator.start()
    stack.callback(emulator.stop)
    # The consumer builds its client from the environment, as the library expects.
    _env(stack, **{EMULATOR_HOST_ENV: emulator.host})
    topic, subscription = emulator.create(
        "payments", ack_deadline=10, enable_exactly_once_delivery=True
    )
    return LocalPubSub(emulator, topic, subscription)


@contextmanager
def services(broker: str) -> Iterator[Services]:
    for noisy in ("werkzeug", "pgserver", "botocore", "urllib3", "google", "bridge", "consumers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The summary reports every decision; the operator's log lines would only interleave.
    logging.getLogger("fencebridge").setLevel(logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="fencebridge-demo-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        local = _start_pubsub(stack) if broker == "pubsub" else _start_sqs(stack)
        database = embedded.start(workdir / "postgres")
        stack.callback(database.stop)
        provider = PaymentProvider()
        provider.start()
        stack.callback(provider.stop)
        yield Services(database, local, provider)


class _SignalledError(Exception):
    """SIGINT or SIGTERM before the demo settled: unwind, stopping every service on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run(
    *,
    broker: str = "sqs",
    keep: bool = False,
    directory: Path | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """Run the demo; 0 when every charge was made exactly once.

    With ``keep``, write the files to explore it with into ``directory`` (a fresh temporary
    directory when None) and keep everything running until SIGINT or SIGTERM.
    """
    if directory is not None and not keep:
        raise ConfigError("--dir names where `--keep` writes its files: add --keep, or drop --dir")
    #: set once the demo settled and only waits: a signal then ends the wait, exit 0
    keeping = threading.Event()
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        first = not stopping.is_set()
        stopping.set()  # a second signal while stopping changes nothing
        if first and not keeping.is_set():
            raise _SignalledError(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(
            broker=broker,
            keep=keep,
            directory=directory,
            out=out,
            keeping=keeping,
            stopping=stopping,
        )
    except _SignalledError as stopped:
        out(f"\nstopped by {stopped} before the demo settled")
        return 128 + stopped.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(
    *,
    broker: str,
    keep: bool,
    directory: Path | None,
    out: Callable[[str], None],
    keeping: threading.Event,
    stopping: threading.Event,
) -> int:
    space = explore.workspace(directory) if keep else None
    out(f"starting: embedded PostgreSQL, local {BROKER_NAMES[broker]}, payment provider ...")
    with services(broker) as svc, ExitStack() as stack:
        if space is not None and space.owned:
            stack.callback(shutil.rmtree, space.directory, True)
        with connect(svc.database.url) as conn:
            migrate(conn)
        # The key every command must use to read the demo's hashes: written to the env file.
        _env(stack, **{IDENTITY_KEY_ENV: secrets.token_hex(32)})
        hasher = IdentityHasher.from_env()
        config_text = CONFIG.format(
            job_type=JOB_TYPE, lease=LEASE_SECONDS, source=svc.broker.source()
        )
        if space is None:
            config = parse_config(config_text, file="demo.toml")
        else:
            explore.write(space, config_text, _shell_env(svc))
            config = load_config(space.config)  # the file the commands will read
        taken_over = threading.Event()
        handler = StallingCharge(PaymentClient(svc.provider.url, timeout=1.0), taken_over)
        store = PostgresStore.connect(svc.database.url, max_size=12)
        stack.callback(store.close)
        bridge = Bridge(
            config, store, hasher, registry=build_registry(config, handlers={JOB_TYPE: handler})
        )
        # The provider applies this charge, then the response never arrives: ambiguous.
        svc.provider.set_fault(
            FaultKind.APPLY_THEN_TIMEOUT, key=hasher.idempotency_key("globex", "order-7")
        )
        published = publish(svc.broker)
        out(
            f"published {published.deliveries} deliveries for {published.operations} operations "
            f"({published.charges} charges and one payload that is not JSON)"
        )
        bridge.start()
        stack.callback(bridge.stop, 5)
        done = _watch(Watched(bridge, store, svc.broker, published, handler, taken_over), out)
        summary = _summary(bridge, store, svc.provider, published)
        out("")
        for line in summary.lines:
            out(line)
        if space is not None:
            keeping.set()
            out("")
            services_lines = [
                ("database", svc.database.url),
                ("broker", svc.broker.describe()),
                ("provider", f"{svc.provider.url}  (ledger: GET {svc.provider.url}/_ledger)"),
            ]
            for line in explore.lines(space, services_lines):
                out(line)
            sys.stdout.flush()
            while not stopping.wait(1.0):
                pass
            out("stopping: bridge, provider, broker, database")
        return 0 if done and summary.ok else 1


def _shell_env(svc: Services) -> dict[str, str]:
    """The env file: what `fencebridge` commands and broker tools need to reach the demo."""
    return {
        DATABASE_URL_ENV: svc.database.url,
        IDENTITY_KEY_ENV: os.environ[IDENTITY_KEY_ENV],
        PROVIDER_URL_ENV: svc.provider.url,
        **svc.broker.env(),
    }


BROKER_NAMES = {"sqs": "SQS (moto)", "pubsub": "Pub/Sub emulator"}


@dataclass
class Watched:
    bridge: Bridge
    store: PostgresStore
    broker: DemoBroker
    published: Published
    handler: StallingCharge
    taken_over: threading.Event


def _watch(w: Watched, out: Callable[[str], None]) -> bool:
    """Print progress until everything settled (True) or the deadline passed (False)."""
    bridge, store, handler, taken_over = w.bridge, w.store, w.handler, w.taken_over
    tty = sys.stdout.isatty()
    started = time.monotonic()
    last_line = 0.0
    while time.monotonic() - started < DEADLINE_SECONDS:
        counts = bridge.pool.counts
        if handler.stalled.is_set() and counts["takeover"] and not taken_over.is_set():
            taken_over.set()  # the row was taken over: let the stalled attempt wake up
        stats = store.operator.stats()
        consumer = _consumer_counts(bridge)
        line = (
            f"received {consumer.get('received', 0):3d} | new {consumer.get('decision.new', 0):3d}"
            f" | replays {consumer.get('decision.replay', 0)}"
            f" | conflicts {consumer.get('decision.conflict', 0)}"
            f" | quarantined {consumer.get('decision.quarantined', 0)}"
            f" | succeeded {stats.total(State.SUCCEEDED):3d}"
            f" | unknown {stats.total(State.UNKNOWN)}"
            f" | fenced out {counts['lease_lost']}"
        )
        now = time.monotonic()
        if tty:
            sys.stdout.write("\r" + line)
            sys.stdout.flush()
        elif now - last_line >= 2:
            out(line)
            last_line = now
        settled = stats.total(State.QUEUED) + stats.total(State.CLAIMED) == 0
        fenced = taken_over.is_set() and counts["lease_lost"] > 0
        acked = consumer.get(w.broker.acked_counter, 0) >= w.published.deliveries
        if settled and fenced and acked:
            if tty:
                sys.stdout.write("\n")
            else:
                out(line)
            return True
        time.sleep(0.25)
    out("\nthe demo did not settle within its deadline")
    return False


def _consumer_counts(bridge: Bridge) -> dict[str, int]:
    counts: dict[str, int] = {}
    for consumer in bridge.consumers.members:
        for name, n in getattr(consumer, "counts", {}).items():
            counts[name] = counts.get(name, 0) + n
    return counts


@dataclass
class Summary:
    lines: list[str]
    ok: bool


def _summary(
    bridge: Bridge, store: PostgresStore, provider: PaymentProvider, published: Published
) -> Summary:
    consumer = _consumer_counts(bridge)
    stats = store.operator.stats()
    events = bridge.pool.counts
    ledger = provider.ledger()
    charged_keys = [c.idempotency_key for c in ledger]
    twice = len(charged_keys) - len(set(charged_keys))
    succeeded = stats.total(State.SUCCEEDED)
    rows = [
        ("deliveries published", published.deliveries),
        ("  new operations", consumer.get("decision.new", 0)),
        ("  replays (nothing new)", consumer.get("decision.replay", 0)),
        ("  conflicts (rejected, nothing changed)", consumer.get("decision.conflict", 0)),
        ("  quarantined (undecodable, kept with reason)", consumer.get("decision.quarantined", 0)),
        ("work rows succeeded", succeeded),
        ("work rows unknown", stats.total(State.UNKNOWN)),
        ("work rows failed", stats.total(State.FAILED_TERMINAL)),
        ("work rows quarantined (payload not readable)", stats.total(State.QUARANTINED)),
        ("takeovers of an expired lease", events["takeover"]),
        ("reconciled by lookup (already applied)", events["reconciled.applied"]),
        ("stale writes fenced out", events["lease_lost"]),
        ("charges in the provider's ledger", len(ledger)),
    ]
    width = max(len(name) for name, _ in rows)
    lines = ["summary", "-" * (width + 8)]
    lines += [f"{name:<{width}}  {value:>6}" for name, value in rows]
    new = consumer.get("decision.new", 0)
    ok = (
        twice == 0 and len(ledger) == succeeded == published.charges and new == published.operations
    )
    lines.append("-" * (width + 8))
    if ok:
        lines.append(
            f"every charge operation charged exactly once ({len(ledger)} charges, 0 twice)"
        )
    else:
        lines.append(
            f"CHECK FAILED: {len(ledger)} charges for {succeeded} succeeded operations "
            f"({published.charges} charges and {published.operations} operations published, "
            f"{new} new), {twice} charged twice"
        )
    return Summary(lines, ok)
