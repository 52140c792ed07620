"""SQS end to end: the bridge beside a bare receive/delete loop on the same local SQS server.

Two arms drain the same number of messages from a fresh queue on one moto server (its own
process, so its work does not share this process's interpreter lock), interleaved round by
round with the order alternating:

* ``bare``: one thread, ``ReceiveMessage`` (10, long poll) then ``DeleteMessageBatch``. Nothing
  is written anywhere: the ceiling the broker itself allows for one receiving loop.
* ``bridge``: the bridge in this process, wired as ``fencebridge run`` wires it (one receiving
  loop, the inbox, the worker pool with its default eight threads, ``after_inbox``), with a
  no-op class B handler. A run ends when every message is deleted *and* every work row has
  succeeded, so the rate is end to end; the rate at which deletes completed is shown too.

In both arms the client is wrapped to time every message from the moment its
``ReceiveMessage`` answer arrived to the moment the ``DeleteMessageBatch`` that carried it
completed (receive → ack), and each phase of the receiving loop (the receive call, the inbox
write, the delete call), which shows where the loop's time goes. Medians over rounds are
reported, with min..max; CPU per delivery is this process's, every thread included.

moto's ``ReceiveMessage`` walks every message the queue holds, so the broker's cost per receive
falls as a round drains its queue (the same way in both arms) and the deeper the queue, the
more the broker alone decides the rate.

Memory: one ``fencebridge run`` process (a real subprocess) with ``after_outcome`` and a
handler that keeps its rows busy, so that 1,000 deliveries are held in flight at once; its
peak resident set (``VmHWM`` from ``/proc/<pid>/status``) is read while they are held.

Messages are sent beforehand in batches of 10, never while an arm runs. The database is
``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded PostgreSQL; the
benchmark creates its own database and drops it. It prints a markdown section for
``docs/benchmarks.md`` on stdout and its progress on stderr::

    python -m bench.sqs              # full run: minutes on a quiet machine, mostly the memory run
    python -m bench.sqs --quick --no-memory   # smoke run, well under a minute
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3

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
from bridge.database import DATABASE_URL_ENV
from bridge.handlers import ConditionalWriteHandler, Context, Success
from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from bridge.runtime import open_bridge
from consumers.sqs import SqsConsumer

REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
JOB = "noop"
TENANT = "bench"
BODY = '{"amount": 1250, "currency": "EUR", "note": "' + "x" * 200 + '"}'
IN_FLIGHT = 1000
RSS_GOAL_MB = 150.0
RATIO_GOAL = 0.8
IDENTITY_KEY = "bench-identity-key-0123456789"
MEMORY_VISIBILITY = 900
BARE = "bare"
BRIDGE = "bridge"

CONFIG = """
[bridge]
worker_id = "bench"
health_port = 0
shutdown_deadline_seconds = {deadline}

[jobs.{job}]
handler = "{handler}"
target_class = "B"

[subscriptions.bench]
source = "sqs"
queue_url = "{queue_url}"
region = "{region}"
endpoint_url = "{endpoint}"
ack_mode = "{ack_mode}"
wait_seconds = 1
visibility_timeout_seconds = {visibility}
job_types = ["{job}"]

[subscriptions.bench.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "value:{job}"
payload = "body"
"""


@dataclass(frozen=True, slots=True)
class Plan:
    rounds: int
    #: messages per arm and round
    messages: int
    #: deliveries held at once in the memory run
    in_flight: int


FULL = Plan(rounds=5, messages=300, in_flight=IN_FLIGHT)
QUICK = Plan(rounds=2, messages=100, in_flight=IN_FLIGHT)


class NoOp(ConditionalWriteHandler):
    """Class B with nothing to write: what remains is the bridge's own cost."""

    def handle(self, ctx: Context) -> Success | None:
        return None


class Busy(ConditionalWriteHandler):
    """Keeps its row claimed (reporting progress) so that deliveries stay held."""

    def handle(self, ctx: Context) -> Success | None:
        for _ in range(600):
            ctx.progress()
            time.sleep(0.5)
        return None


# -- the local SQS server --------------------------------------------------------------------


@contextmanager
def moto_server() -> Iterator[str]:
    """``python -m moto.server`` on a free port, in its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def client(endpoint: str) -> Any:
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def send_batch(sqs: Any, url: str, start: int, count: int) -> None:
    """Messages ``start`` .. ``start + count - 1`` of the queue, in one SendMessageBatch."""
    name = url.rpartition("/")[2]
    entries = [
        {
            "Id": str(i),
            "MessageBody": BODY,
            "MessageAttributes": {
                "tenant_id": {"DataType": "String", "StringValue": TENANT},
                "operation_id": {"DataType": "String", "StringValue": f"{name}-{start + i}"},
            },
        }
        for i in range(count)
    ]
    response = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    if response.get("Failed"):
        raise RuntimeError(f"send failed: {response['Failed'][:1]}")


def new_queue(sqs: Any, label: str, visibility: int = 60) -> str:
    name = f"bench-{label}-{time.monotonic_ns()}"
    attributes = {"VisibilityTimeout": str(visibility)}
    url: str = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    return url


def fill(sqs: Any, url: str, messages: int) -> None:
    """Send ``messages`` messages in batches of 10, from four threads."""
    with ThreadPoolExecutor(4) as pool:
        list(
            pool.map(
                lambda s: send_batch(sqs, url, s, min(10, messages - s)), range(0, messages, 10)
            )
        )


def on_queue(sqs: Any, url: str) -> tuple[int, int]:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


# -- timing receive → ack ------------------------------------------------------------------------


RECEIVE_CALL = "ReceiveMessage call"
INBOX_WRITE = "from the receive to the delete (the bridge: decode, inbox transaction, hand-off)"
DELETE_CALL = "DeleteMessageBatch call"
PHASES = (RECEIVE_CALL, INBOX_WRITE, DELETE_CALL)


class TimedClient:
    """A boto3 SQS client that times each message from its receive to its delete batch.

    It also keeps the phases of each turn of a receiving loop: the receive call, the time from
    its answer to the delete call on the same thread (for the bridge: decoding, the inbox
    transaction and the hand-off), and the delete call.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._received: dict[str, float] = {}
        self.latencies: list[float] = []
        self.deleted = 0
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}
        self._turn = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def receive_message(self, **kwargs: Any) -> Any:
        sent = time.perf_counter()
        response = self._inner.receive_message(**kwargs)
        now = time.perf_counter()
        self._turn.received = now
        with self._lock:
            if response.get("Messages"):
                self.phases[RECEIVE_CALL].append(now - sent)
            for m in response.get("Messages", []):
                self._received[m["ReceiptHandle"]] = now
        return response

    def delete_message_batch(self, **kwargs: Any) -> Any:
        sent = time.perf_counter()
        received = getattr(self._turn, "received", None)
        self._turn.received = None
        response = self._inner.delete_message_batch(**kwargs)
        now = time.perf_counter()
        by_id = {e["Id"]: e["ReceiptHandle"] for e in kwargs["Entries"]}
        with self._lock:
            self.phases[DELETE_CALL].append(now - sent)
            if received is not None:
                self.phases[INBOX_WRITE].append(sent - received)
            for ok in response.get("Successful", []):
                started = self._received.pop(by_id[ok["Id"]], None)
                if started is not None:
                    self.latencies.append(now - started)
                self.deleted += 1
        return response


# -- the arms ------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One arm, one round."""

    messages: int
    seconds: float
    #: seconds until the last delete completed (the bridge keeps working after that)
    ack_seconds: float
    #: CPU seconds this process spent (every thread: receiving loop, bridge, timing wrapper)
    cpu_seconds: float
    latencies: list[float]
    #: durations of the receiving loop's phases, one per batch
    phases: dict[str, list[float]]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def ack_rate(self) -> float:
        return self.messages / self.ack_seconds

    @property
    def cpu_us(self) -> float:
        """CPU microseconds of this process per delivery."""
        return self.cpu_seconds / self.messages * 1e6


def bare_arm(endpoint: str, url: str, plan: Plan) -> Sample:
    sqs = TimedClient(client(endpoint))
    cpu = time.process_time()
    started = time.perf_counter()
    while sqs.deleted < plan.messages:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if got:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ]
            sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    took = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return Sample(plan.messages, took, took, cpu, sqs.latencies, sqs.phases)


def bridge_arm(endpoint: str, url: str, plan: Plan, db_url: str) -> Sample:
    """The bridge as ``fencebridge run`` opens it, with a timed client; until all succeeded."""
    messages = plan.messages
    empty_work(db_url)
    config = parse_config(
        CONFIG.format(
            deadline=10,
            job=JOB,
            handler="bench.sqs:NoOp",
            queue_url=url,
            region=REGION,
            endpoint=endpoint,
            ack_mode="after_inbox",
            visibility=60,
        ),
        file="bench.toml",
    )
    bridge = open_bridge(config, db_url, IdentityHasher(IDENTITY_KEY.encode()))
    (consumer,) = bridge.consumers
    assert isinstance(consumer, SqsConsumer)
    # The one intrusion: the benchmark's timing wrapper around the client the runtime built.
    sqs = TimedClient(consumer._client)
    consumer._client = sqs
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        bridge.start()
        acked = None
        while True:
            if acked is None and sqs.deleted >= messages:
                acked = time.perf_counter() - started
            if acked is not None and work_rows(db_url, succeeded=True) >= messages:
                break
            time.sleep(0.05)
        took = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        bridge.stop(10)
        bridge.store.close()
    return Sample(messages, took, acked, cpu, sqs.latencies, sqs.phases)


# -- peak memory of one bridge process ------------------------------------------------------------


@dataclass
class Memory:
    idle_mb: float
    peak_mb: float
    held: int


def status_mb(pid: int, field_name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field_name} not in /proc/{pid}/status")


def memory_run(endpoint: str, db_url: str, in_flight: int) -> Memory:
    """``fencebridge run`` holding ``in_flight`` deliveries (after_outcome) at once."""
    sqs = client(endpoint)
    url = new_queue(sqs, "rss", MEMORY_VISIBILITY)
    fill(sqs, url, in_flight)
    empty_work(db_url)
    with tempfile.TemporaryDirectory(prefix="fencebridge-bench-") as tmp:
        path = Path(tmp) / "bridge.toml"
        path.write_text(
            CONFIG.format(
                deadline=1,
                job=JOB,
                handler="bench.sqs:Busy",
                queue_url=url,
                region=REGION,
                endpoint=endpoint,
                ack_mode="after_outcome",
                # Long enough that no extension round runs while the memory is read.
                visibility=MEMORY_VISIBILITY,
            ),
            encoding="utf-8",
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "AWS_"))},
            **CREDENTIALS,
            DATABASE_URL_ENV: db_url,
            IDENTITY_KEY_ENV: IDENTITY_KEY,
        }
        log_file = Path(tmp) / "bridge.log"
        with log_file.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "--config", str(path)],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for("start-up", lambda: "bridge started" in log_file.read_text(), proc, log_file)
            idle_mb = status_mb(proc.pid, "VmHWM")
            # Every message received and held: all in the table, none visible, all in flight.
            # Polled slowly: moto counts by walking the queue, and it has its hands full.
            wait_for(
                f"{in_flight:,} deliveries held",
                lambda: work_rows(db_url) == in_flight and on_queue(sqs, url) == (0, in_flight),
                proc,
                log_file,
                interval=2.0,
            )
            peak = status_mb(proc.pid, "VmHWM")  # the high-water mark so far
            held = on_queue(sqs, url)[1]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return Memory(idle_mb, peak, held)


def wait_for(
    what: str,
    check: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    log_file: Path,
    *,
    interval: float = 0.1,
    timeout: float = 1800.0,  # moto's receive slows down with 1,000 messages in flight
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"the bridge exited before {what}:\n{log_file.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- the report ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {BARE: [], BRIDGE: []})
    memory: Memory | None = None
    memory_error: str | None = None

    def ratios(self) -> list[float]:
        return [
            b.rate / a.rate for a, b in zip(self.samples[BARE], self.samples[BRIDGE], strict=True)
        ]

    def markdown(self) -> str:
        plan = self.plan
        out = [
            "## SQS end to end",
            "",
            "`python -m bench.sqs` ([bench/sqs.py](../bench/sqs.py)): the bridge beside a bare"
            " boto3 `ReceiveMessage`(10) + `DeleteMessageBatch` loop, one receiving loop each,"
            " on one local SQS server (moto, its own process) and the same host's PostgreSQL."
            f" {plan.rounds} interleaved rounds of {plan.messages:,} messages per arm, sent"
            " beforehand in batches of 10; the bridge runs in process with its default eight"
            " worker threads, `after_inbox` and a no-op class B handler, and a round ends when"
            " every row has succeeded. Medians over rounds (min..max); receive → ack is each"
            " message's time from its `ReceiveMessage` answer to the completion of the"
            " `DeleteMessageBatch` that carried it, pooled over rounds; CPU is this process's"
            " (every thread) per delivery, moto and PostgreSQL not included. moto's"
            " `ReceiveMessage` walks every message of the queue, so its cost falls as a round"
            " drains the queue, the same way in both arms.",
            "",
            *facts_table(self.facts),
            "",
            "| arm | deliveries/s, end to end | deletes/s | CPU us/delivery | receive → ack p50"
            " | p99 |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for arm in (BARE, BRIDGE):
            samples = self.samples[arm]
            pooled = [x for s in samples for x in s.latencies]
            out.append(
                f"| {arm} | {spread([s.rate for s in samples])} "
                f"| {spread([s.ack_rate for s in samples])} "
                f"| {statistics.median(s.cpu_us for s in samples):,.0f} "
                f"| {percentile(pooled, 0.5) * 1000:.1f} ms "
                f"| {percentile(pooled, 0.99) * 1000:.1f} ms |"
            )
        ratio = statistics.median(self.ratios())
        out += [
            "",
            f"bridge / bare, end to end: median of the per-round ratios {ratio:.2f}x"
            f" ({min(self.ratios()):.2f}..{max(self.ratios()):.2f}).",
            "",
            "Where a receiving loop's time goes, per batch of up to 10 (median, p99; pooled"
            " over rounds):",
            "",
            "| phase | bare | bridge |",
            "| --- | ---: | ---: |",
        ]
        for phase in PHASES:
            cells = []
            for arm in (BARE, BRIDGE):
                pooled = [x for s in self.samples[arm] for x in s.phases[phase]]
                cells.append(
                    f"{percentile(pooled, 0.5) * 1000:.1f} / {percentile(pooled, 0.99) * 1000:.1f}"
                    " ms"
                    if pooled
                    else "-"
                )
            out.append(f"| {phase} | {cells[0]} | {cells[1]} |")
        goals = [
            "| goal | measured | met |",
            "| --- | --- | --- |",
            f"| end-to-end deliveries/s >= {RATIO_GOAL}x the bare loop | {ratio:.2f}x "
            f"| {'yes' if ratio >= RATIO_GOAL else 'NO'} |",
        ]
        if self.memory is not None:
            m = self.memory
            out += [
                "",
                f"Memory: one `fencebridge run` process (`after_outcome`, a handler that keeps"
                f" its rows claimed) holding {m.held:,} deliveries in flight: peak resident set"
                f" (`VmHWM`) {m.peak_mb:.0f} MB, of which {m.idle_mb:.0f} MB at start-up before"
                " any message.",
            ]
            goals.append(
                f"| peak RSS with {plan.in_flight:,} deliveries in flight <= {RSS_GOAL_MB:.0f} MB"
                f" | {m.peak_mb:.0f} MB | {'yes' if m.peak_mb <= RSS_GOAL_MB else 'NO'} |"
            )
        elif self.memory_error is not None:
            out += ["", f"Memory: not measured ({self.memory_error})."]
            goals.append(
                f"| peak RSS with {plan.in_flight:,} deliveries in flight <= {RSS_GOAL_MB:.0f} MB"
                " | not measured | ? |"
            )
        out += ["", *goals]
        return "\n".join(out) + "\n"


def run(database_url: str | None, plan: Plan, argv: list[str], *, memory: bool) -> Report:
    report = Report(plan)
    # The in-process bridge builds its SQS client from the environment, as in production.
    os.environ.update(CREDENTIALS)
    sqs_fact = (
        "SQS",
        f"moto {metadata.version('moto')} server on 127.0.0.1, boto3 {metadata.version('boto3')}",
    )
    with (
        server(database_url) as admin_url,
        moto_server() as endpoint,
        report_facts(admin_url, argv, sqs_fact) as facts,
    ):
        report.facts = facts
        with bench_database(admin_url, "sqs") as db_url:
            sqs = client(endpoint)
            for n in range(plan.rounds):
                order = (BARE, BRIDGE) if n % 2 == 0 else (BRIDGE, BARE)
                for arm in order:
                    url = new_queue(sqs, arm)
                    fill(sqs, url, plan.messages)
                    if arm == BARE:
                        sample = bare_arm(endpoint, url, plan)
                    else:
                        sample = bridge_arm(endpoint, url, plan, db_url)
                    report.samples[arm].append(sample)
                    log(
                        f"round {n + 1}/{plan.rounds} {arm}: {sample.rate:,.0f}/s end to end,"
                        f" {sample.ack_rate:,.0f}/s deletes"
                    )
                    sqs.delete_queue(QueueUrl=url)
            if memory:
                try:
                    report.memory = memory_run(endpoint, db_url, plan.in_flight)
                except RuntimeError as exc:  # the throughput results still stand
                    report.memory_error = str(exc).splitlines()[0]
                log(f"memory: {report.memory or report.memory_error}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.sqs", "SQS end to end: the bridge beside a bare receive/delete loop.")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per arm")
    parser.add_argument("--messages", type=int, help="messages per arm and round")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS run")
    args, command = command_line(parser, argv)
    plan = QUICK if args.quick else FULL
    plan = Plan(
        rounds=args.rounds or plan.rounds,
        messages=args.messages or plan.messages,
        in_flight=plan.in_flight,
    )
    report = run(args.database_url, plan, command, memory=not args.no_memory)
    print(report.markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
