"""Pub/Sub: the consumer beside a bare subscriber on the same Pub/Sub emulator.

Three arms drain the same number of messages from a fresh subscription on one Pub/Sub emulator
(Google's, a JVM process of its own), interleaved round by round with the order rotating:

* ``bare``: ``SubscriberClient.subscribe`` with a callback that acks at once (with
  exactly-once delivery on, it counts a message when ``ack_with_response()`` resolves). Nothing
  is written anywhere: the ceiling the emulator and the client library allow.
* ``consumer``: :class:`~consumers.pubsub.source.PubSubConsumer` with its inbox, configured with the
  defaults: every message is decoded, written as a work row in one transaction per batch, and
  acked after COMMIT. Settlement is a no-op (nothing claims the rows). The round ends when every
  message is acked; the rows are counted afterwards. This is the consumer's own cost, and the
  arm the goal is about.
* ``bridge``: the same consumer wired as ``fencebridge run`` wires it, with the worker pool (its
  default eight threads) and a no-op class B handler; the round ends when every work row has
  succeeded. It shows what the whole bridge sustains end to end on the same machine.

All arms use the same flow control (1,000 messages outstanding) and run once with
exactly-once delivery off and once with it on.

A second section drains a **backlog** the way a deployment meets one: 5,000 messages published
beforehand to an exactly-once subscription with the service's default 10 s ack deadline, drained
by **two processes** at once, either two bare subscribers (``bare``) or two consumers with their
inboxes (``consumer``) on the same database. A round ends when the two processes together have
had every message's ack confirmed; the consumer's rows are counted afterwards (one per message).

Messages are published beforehand, never while
an arm runs. The emulator is started here (found as the tests find it: ``gcloud info`` or
``$FENCEBRIDGE_PUBSUB_EMULATOR``) unless ``--emulator-host`` names a running one. The database
is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded PostgreSQL; the
benchmark creates its own database and drops it. It prints a markdown section for
``docs/benchmarks.md`` on stdout and its progress on stderr::

    python -m bench.pubsub              # full run, a few minutes
    python -m bench.pubsub --quick      # smoke run, about a minute
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from typing import Any

from google.cloud import pubsub_v1

from bench.store import (
    arguments,
    bench_database,
    command_line,
    empty_work,
    facts_table,
    log,
    report_facts,
    server,
    spread,
    work_rows,
)
from bridge.config import parse_config
from bridge.demo.emulator import (
    EMULATOR_ENV,
    PubSubEmulator,
    find_launcher,
    with_emulator_host,
)
from bridge.handlers import ConditionalWriteHandler, Context, Success
from bridge.identity import IdentityHasher
from bridge.ingest.decode import decode
from bridge.ingest.inbox import Inbox
from bridge.runtime.process import build_registry
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore
from consumers.pubsub.source import PubSubConsumer, from_config, subscriber_client

JOB = "noop"
TENANT = "bench"
BODY = b'{"amount": 1250, "currency": "EUR", "note": "' + b"x" * 200 + b'"}'
FLOW_MAX_MESSAGES = 1000
RATIO_GOAL = 0.8
BARE = "bare"
CONSUMER = "consumer"
BRIDGE = "bridge"
ARMS = (BARE, CONSUMER, BRIDGE)
MODES = (False, True)

CONFIG = """
[bridge]
worker_id = "bench"
health_port = 0

[jobs.{job}]
handler = "bench.pubsub:NoOp"
target_class = "B"

[subscriptions.bench]
source = "pubsub"
subscription = "{path}"
ack_mode = "after_inbox"
job_types = ["{job}"]
flow_control = {{ max_messages = {flow} }}

[subscriptions.bench.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:{job}"
payload = "body"
"""


@dataclass(frozen=True, slots=True)
class Plan:
    rounds: int
    #: messages per arm, mode and round
    messages: int
    #: the two-process backlog section: rounds and messages per round
    backlog_rounds: int = 3
    backlog: int = 5000


FULL = Plan(rounds=5, messages=3000)
QUICK = Plan(rounds=2, messages=1000, backlog_rounds=1, backlog=2000)
PROCESSES = 2
BACKLOG_ACK_DEADLINE = 10


class NoOp(ConditionalWriteHandler):
    """Class B with nothing to write: what remains is the bridge's own cost."""

    def handle(self, ctx: Context) -> Success | None:
        return None


# -- the emulator ------------------------------------------------------------------------------


@contextmanager
def emulator_at(host: str | None) -> Iterator[PubSubEmulator]:
    """The emulator at ``host``, or one started for this run."""
    if host:
        yield PubSubEmulator.attach(host)
        return
    launcher, why = find_launcher()
    if launcher is None:
        raise SystemExit(f"no Pub/Sub emulator: {why} (set {EMULATOR_ENV} or --emulator-host)")
    emulator = PubSubEmulator(launcher)
    log(f"starting the Pub/Sub emulator on {emulator.host}")
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


def fresh_subscription(
    emulator: PubSubEmulator, label: str, exactly_once: bool, n: int, ack_deadline: int = 60
) -> str:
    """A new topic and subscription holding ``n`` published messages; returns its path."""
    topic, path = emulator.create(
        f"bench-{label}-{time.monotonic_ns()}",
        ack_deadline=ack_deadline,
        enable_exactly_once_delivery=exactly_once,
    )
    name = path.rpartition("/")[2]
    messages = [(BODY, {"tenant_id": TENANT, "operation_id": f"{name}-{i}"}) for i in range(n)]
    for start in range(0, n, 1000):
        emulator.publish_many(topic, messages[start : start + 1000])
    return path


# -- the arms ------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One arm, one round."""

    messages: int
    seconds: float
    #: seconds until the last ack completed (the bridge keeps working after that)
    ack_seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def ack_rate(self) -> float:
        return self.messages / self.ack_seconds


class AckCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acked = 0

    def add(self, _: Any = None) -> None:
        with self._lock:
            self.acked += 1


def bare_arm(emulator: PubSubEmulator, path: str, plan: Plan, exactly_once: bool) -> Sample:
    counter = AckCounter()

    def callback(message: Any) -> None:
        if exactly_once:
            message.ack_with_response().add_done_callback(counter.add)
        else:
            message.ack()
            counter.add()

    client = subscriber_client(emulator.host)
    flow = pubsub_v1.types.FlowControl(max_messages=FLOW_MAX_MESSAGES)
    started = time.perf_counter()
    future = client.subscribe(path, callback, flow_control=flow)
    try:
        while counter.acked < plan.messages:
            time.sleep(0.005)
        took = time.perf_counter() - started
    finally:
        future.cancel()
        future.result(timeout=30)
        client.close()
    return Sample(plan.messages, took, took)


def bridge_arm(
    emulator: PubSubEmulator, path: str, plan: Plan, db_url: str, *, workers: bool
) -> Sample:
    """The consumer and inbox as the runtime wires them, with or without the worker pool.

    Without workers a round ends when every message is acked; with them, when every row has
    succeeded.
    """
    empty_work(db_url)
    config = parse_config(
        CONFIG.format(job=JOB, path=path, flow=FLOW_MAX_MESSAGES), file="bench.toml"
    )
    settings = config.bridge
    sub = config.subscriptions["bench"]
    store = PostgresStore.connect(db_url, max_size=settings.worker_threads + 6)
    pool = WorkerPool(
        store,
        build_registry(config, handlers={JOB: NoOp()}),
        IdentityHasher(b"bench-identity-key-0123456789"),
        worker_id=settings.worker_id,
        threads=settings.worker_threads,
        claim_batch=settings.claim_batch,
        poll_interval=settings.poll_interval_seconds,
    )
    inbox = Inbox(
        store.inbox,
        partial(decode, config.decode_rules("bench")),
        pool=pool if workers else None,
    )
    consumer = with_emulator_host(emulator.host, lambda: from_config(sub, inbox, store))
    try:
        if workers:
            pool.start()
        started = time.perf_counter()
        consumer.start()
        acked = None
        while True:
            if acked is None and consumer.counts["acked"] >= plan.messages:
                acked = time.perf_counter() - started
                if not workers:
                    break
            if acked is not None and work_rows(db_url, succeeded=True) >= plan.messages:
                break
            time.sleep(0.005 if acked is None else 0.02)
        took = time.perf_counter() - started
    finally:
        consumer.stop(10)
        if workers:
            pool.stop(10)
        store.close()
    new = consumer.counts["decision.new"]
    if new != plan.messages or work_rows(db_url) != plan.messages:
        raise RuntimeError(f"the {path} round did not write each message once: {consumer.counts}")
    return Sample(plan.messages, took, acked)


# -- two processes on one backlog ----------------------------------------------------------------


def _bare_process(host: str, path: str, acked: Any, go: Any, stop: Any) -> None:
    """A bare subscriber in its own process: counts each confirmed ack into ``acked``."""

    def confirmed(_: Any) -> None:
        with acked.get_lock():
            acked.value += 1

    def callback(message: Any) -> None:
        message.ack_with_response().add_done_callback(confirmed)

    client = subscriber_client(host)
    go.wait()
    future = client.subscribe(
        path, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=FLOW_MAX_MESSAGES)
    )
    stop.wait()
    future.cancel()
    with suppress(Exception):  # a cancelled stream ends with an error
        future.result(timeout=30)
    client.close()


def _consumer_process(  # noqa: PLR0917  (the child process entry point)
    host: str,
    path: str,
    db_url: str,
    acked: Any,
    go: Any,
    stop: Any,
) -> None:
    """A consumer with its inbox in its own process, as ``fencebridge run`` builds it."""
    config = parse_config(
        CONFIG.format(job=JOB, path=path, flow=FLOW_MAX_MESSAGES), file="bench.toml"
    )
    store = PostgresStore.connect(db_url, max_size=4)
    inbox = Inbox(store.inbox, partial(decode, config.decode_rules("bench")))
    consumer = PubSubConsumer(subscriber_client(host), path, "bench", inbox, close_client=True)
    go.wait()
    consumer.start()
    reported = 0
    while not stop.wait(0.02):
        now = consumer.counts["acked"]
        with acked.get_lock():
            acked.value += now - reported
        reported = now
    consumer.stop(10)
    store.close()


def two_processes(emulator: PubSubEmulator, path: str, n: int, arm: str, db_url: str) -> Sample:
    """``PROCESSES`` processes of one arm drain ``n`` messages; timed from a common start."""
    spawn = multiprocessing.get_context("spawn")
    acked = spawn.Value("q", 0)
    go, stop = spawn.Event(), spawn.Event()
    if arm == BARE:
        target: Any = _bare_process
        args: tuple[Any, ...] = (emulator.host, path, acked, go, stop)
    else:
        empty_work(db_url)
        target = _consumer_process
        args = (emulator.host, path, db_url, acked, go, stop)
    children = [spawn.Process(target=target, args=args, daemon=True) for _ in range(PROCESSES)]
    for child in children:
        child.start()
    time.sleep(3.0)  # imports and clients ready before the clock starts
    started = time.perf_counter()
    go.set()
    deadline = started + 600
    while acked.value < n:
        if time.perf_counter() > deadline:
            stop.set()
            raise RuntimeError(f"{arm}: only {acked.value} of {n} acks confirmed in 600 s")
        time.sleep(0.005)
    took = time.perf_counter() - started
    stop.set()
    for child in children:
        child.join(30)
    if arm != BARE and work_rows(db_url) != n:
        raise RuntimeError(f"{arm}: {work_rows(db_url)} rows for {n} messages")
    return Sample(n, took, took)


# -- the report ------------------------------------------------------------------------------------


def _mode(exactly_once: bool) -> str:
    return "exactly-once on" if exactly_once else "exactly-once off"


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    samples: dict[tuple[bool, str], list[Sample]] = field(
        default_factory=lambda: {(m, a): [] for m in MODES for a in ARMS}
    )
    backlog: dict[str, list[Sample]] = field(default_factory=lambda: {BARE: [], CONSUMER: []})

    def ratios(self, exactly_once: bool, arm: str) -> list[float]:
        bare, other = self.samples[exactly_once, BARE], self.samples[exactly_once, arm]
        return [b.rate / a.rate for a, b in zip(bare, other, strict=True)]

    def markdown(self) -> str:
        plan = self.plan
        out = [
            "## Pub/Sub consumer",
            "",
            "`python -m bench.pubsub` ([bench/pubsub.py](../bench/pubsub.py)): the Pub/Sub"
            " consumer beside a bare `SubscriberClient.subscribe` whose callback only acks, on"
            " one local Pub/Sub emulator (Google's, its own JVM process) and the same host's"
            f" PostgreSQL. {plan.rounds} interleaved rounds of {plan.messages:,} messages per"
            " arm and mode, published beforehand to a fresh subscription; every arm uses flow"
            f" control of {FLOW_MAX_MESSAGES:,} outstanding messages. `consumer` is the"
            " consumer and its inbox with the configuration defaults (batches of up to 100"
            " messages or 50 ms, one writer, `after_inbox`): each message decoded, written as"
            " a work row, acked after COMMIT; settlement is a no-op and the round ends at the"
            " last ack. `bridge` adds the worker pool (eight threads, a no-op class B handler)"
            " and ends when every row has succeeded. With exactly-once on, every arm counts an"
            " ack only once the emulator confirmed it. Medians over rounds (min..max); the"
            " ratio is the median of the per-round ratios to `bare`.",
            "",
            *facts_table(self.facts),
            "",
            "| mode | arm | deliveries/s | acks/s | / bare |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        goals = ["| goal | measured | met |", "| --- | --- | --- |"]
        for mode in MODES:
            for arm in ARMS:
                samples = self.samples[mode, arm]
                shown = ""
                if arm != BARE:
                    ratios = self.ratios(mode, arm)
                    shown = (
                        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"
                    )
                out.append(
                    f"| {_mode(mode)} | {arm} | {spread([s.rate for s in samples])} "
                    f"| {spread([s.ack_rate for s in samples])} | {shown} |"
                )
            ratio = statistics.median(self.ratios(mode, CONSUMER))
            goals.append(
                f"| {_mode(mode)}: consumer deliveries/s >= {RATIO_GOAL}x the bare subscriber"
                f" | {ratio:.2f}x | {'yes' if ratio >= RATIO_GOAL else 'NO'} |"
            )
        if self.backlog[BARE]:
            ratios = [
                c.rate / b.rate
                for b, c in zip(self.backlog[BARE], self.backlog[CONSUMER], strict=True)
            ]
            ratio = statistics.median(ratios)
            out += [
                "",
                f"Backlog of {plan.backlog:,} messages, exactly-once on, {BACKLOG_ACK_DEADLINE} s"
                f" ack deadline, {PROCESSES} processes per arm, {plan.backlog_rounds} rounds:",
                "",
                "| arm | deliveries/s | / bare |",
                "| --- | ---: | ---: |",
                f"| bare | {spread([s.rate for s in self.backlog[BARE]])} | |",
                f"| consumer | {spread([s.rate for s in self.backlog[CONSUMER]])} "
                f"| {ratio:.2f}x ({min(ratios):.2f}..{max(ratios):.2f}) |",
            ]
            goals.append(
                f"| backlog, two processes: consumer >= {RATIO_GOAL}x the bare subscriber"
                f" | {ratio:.2f}x | {'yes' if ratio >= RATIO_GOAL else 'NO'} |"
            )
        out += ["", *goals]
        return "\n".join(out) + "\n"


def run(database_url: str | None, emulator_host: str | None, plan: Plan, argv: list[str]) -> Report:
    report = Report(plan)
    pubsub_fact = (
        "Pub/Sub",
        f"Google Cloud SDK Pub/Sub emulator on 127.0.0.1, google-cloud-pubsub "
        f"{metadata.version('google-cloud-pubsub')}, grpcio {metadata.version('grpcio')}",
    )
    with (
        server(database_url) as admin_url,
        emulator_at(emulator_host) as emulator,
        report_facts(admin_url, argv, pubsub_fact) as facts,
    ):
        report.facts = facts
        with bench_database(admin_url, "pubsub") as db_url:
            for n in range(plan.rounds):
                for mode in MODES:
                    order = ARMS[n % len(ARMS) :] + ARMS[: n % len(ARMS)]
                    for arm in order:
                        path = fresh_subscription(emulator, arm, mode, plan.messages)
                        if arm == BARE:
                            sample = bare_arm(emulator, path, plan, mode)
                        else:
                            sample = bridge_arm(emulator, path, plan, db_url, workers=arm == BRIDGE)
                        report.samples[mode, arm].append(sample)
                        log(
                            f"round {n + 1}/{plan.rounds} {_mode(mode)} {arm}: "
                            f"{sample.rate:,.0f}/s, {sample.ack_rate:,.0f}/s acks"
                        )
            for n in range(plan.backlog_rounds):
                order = (BARE, CONSUMER) if n % 2 == 0 else (CONSUMER, BARE)
                for arm in order:
                    path = fresh_subscription(
                        emulator, f"backlog-{arm}", True, plan.backlog, BACKLOG_ACK_DEADLINE
                    )
                    sample = two_processes(emulator, path, plan.backlog, arm, db_url)
                    report.backlog[arm].append(sample)
                    log(f"backlog round {n + 1}/{plan.backlog_rounds} {arm}: {sample.rate:,.0f}/s")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        "bench.pubsub", "Pub/Sub: the consumer beside a bare subscriber that only acks."
    )
    parser.add_argument(
        "--emulator-host", help="HOST:PORT of a running Pub/Sub emulator (default: start one)"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per arm and mode")
    parser.add_argument("--messages", type=int, help="messages per arm, mode and round")
    parser.add_argument("--backlog", type=int, help="messages of the two-process backlog")
    parser.add_argument("--backlog-rounds", type=int, help="rounds of the backlog section")
    args, command = command_line(parser, argv)
    plan = QUICK if args.quick else FULL
    plan = Plan(
        rounds=plan.rounds if args.rounds is None else args.rounds,
        messages=args.messages or plan.messages,
        backlog_rounds=(
            plan.backlog_rounds if args.backlog_rounds is None else args.backlog_rounds
        ),
        backlog=args.backlog or plan.backlog,
    )
    print(run(args.database_url, args.emulator_host, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
