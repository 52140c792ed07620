"""SQS end to end: two bridge processes beside two bare receive/delete processes, one moto.

Two arms drain the same backlog from a fresh queue on one moto server (its own process),
interleaved round by round with the order alternating:

* ``bare``: two processes, each one loop of ``ReceiveMessage`` (10, long poll) then
  ``DeleteMessageBatch``. Nothing is written anywhere: the ceiling the broker itself allows
  for two receiving processes.
* ``bridge``: two ``fencebridge run`` processes (real subprocesses started from their TOML
  file, ``after_inbox``, default worker threads, a no-op class B handler). A run ends when
  every message is deleted *and* every work row has succeeded, so the rate is end to end.

The backlog (``--messages``, 5,000 by default) is sent beforehand in batches of 10. Timing
starts once both processes of an arm are up: the bare processes wait for a go after importing
boto3; the bridges cannot be held back, so their clock starts when both answer ``/readyz`` and
the rows one of them settled before that are not counted. CPU per delivery is the two
processes' user + system time, read from ``/proc`` before they stop (moto and PostgreSQL not
included).

moto's ``ReceiveMessage`` walks every message the queue holds, so the broker's cost per receive
falls as a round drains its queue (the same way in both arms). moto also recomputes every count
of a queue several times for each message it sends or returns, which at 5,000 messages made one
receive take seconds; the benchmark's moto server keeps a queue's attributes for half a second
(:func:`serve_moto`), the same for both arms.

Memory: one ``fencebridge run`` process with ``after_outcome`` and a handler that keeps its rows
busy, so that 1,000 deliveries are held in flight at once; its peak resident set (``VmHWM``
from ``/proc/<pid>/status``) is read while they are held.

The database is ``--database-url``, else ``$FENCEBRIDGE_DATABASE_URL``, else an embedded
PostgreSQL; the benchmark creates its own database and drops it. It prints a markdown section
for ``docs/benchmarks.md`` on stdout and its progress on stderr::

    python -m bench.sqs              # full run: several minutes on a quiet machine
    python -m bench.sqs --quick --no-memory   # smoke run, about a minute
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

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
from bridge.database import DATABASE_URL_ENV
from bridge.handlers import ConditionalWriteHandler, Context, Success
from bridge.identity import IDENTITY_KEY_ENV

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
PROCESSES = 2
BARE = "bare"
BRIDGE = "bridge"
GO = "go"
READY = "ready"
#: how long the moto server keeps a queue's computed attributes (see :func:`serve_moto`)
ATTRIBUTES_SECONDS = 0.5
#: how often the end of a run is looked for (in the database or the processes' own counts:
#: moto counts a queue by walking it, which a deep queue makes slow)
POLL_SECONDS = 0.25

CONFIG = """
[bridge]
worker_id = "{worker}"
health_port = {health_port}
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


FULL = Plan(rounds=2, messages=5000, in_flight=IN_FLIGHT)
QUICK = Plan(rounds=1, messages=500, in_flight=IN_FLIGHT)


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def moto_server() -> Iterator[str]:
    """``python -m moto.server`` on a free port, in its own process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.sqs", "--moto-server", str(port)],
        cwd=REPO,
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


def serve_moto(port: int) -> None:
    """moto's server, its queue attributes computed at most twice a second per queue.

    moto recomputes every attribute of a queue (each count a walk of all its messages)
    several times for each message it sends or returns: at 5,000 messages one receive took
    four seconds, and the benchmark measured moto's bookkeeping, not the consumers. A queue's
    attributes are the same for half a second here; the counts the benchmark reads at the end
    are re-read until they agree.
    """
    from moto import server as moto_main  # noqa: PLC0415  (only in the server's process)
    from moto.sqs.models import Queue  # noqa: PLC0415

    compute = Queue.__dict__["attributes"].fget

    def cached(queue: Any) -> dict[str, Any]:
        now = time.monotonic()
        hit = queue.__dict__.get("_bench_attributes")
        if hit is None or now - hit[0] > ATTRIBUTES_SECONDS:
            hit = (now, compute(queue))
            queue.__dict__["_bench_attributes"] = hit
        return dict(hit[1])

    Queue.attributes = property(cached)  # type: ignore[assignment,method-assign]
    moto_main.main(["-H", "127.0.0.1", "-p", str(port)])


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


def queue_empty(sqs: Any, url: str) -> bool:
    """Empty on two reads a cache period apart: moto counts visible and in-flight messages
    one after the other, and the server keeps a queue's counts for that long."""
    if on_queue(sqs, url) != (0, 0):
        return False
    time.sleep(ATTRIBUTES_SECONDS * 1.2)
    return on_queue(sqs, url) == (0, 0)


# -- processes ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a running process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def child_env(db_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "AWS_"))}
    env.update(CREDENTIALS)
    env["PYTHONUNBUFFERED"] = "1"
    if db_url is not None:
        env[DATABASE_URL_ENV] = db_url
        env[IDENTITY_KEY_ENV] = IDENTITY_KEY
    return env


def stop(proc: subprocess.Popen[Any], timeout: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bare_loop(endpoint: str, url: str) -> int:
    """One bare receiving process: ready, wait for go, receive and delete until SIGTERM."""
    stopping = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    sqs = client(endpoint)
    sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])  # warm up
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        return 1
    deleted = 0
    while not stopping:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if got:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ]
            done = len(sqs.delete_message_batch(QueueUrl=url, Entries=entries)["Successful"])
            deleted += done
            print(done, flush=True)  # the parent sums these: no need to ask moto for counts
    return 0


# -- the arms ------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One arm, one round."""

    #: messages counted (those settled after the clock started)
    messages: int
    seconds: float
    #: CPU seconds of the arm's processes
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def cpu_us(self) -> float:
        """CPU microseconds of the arm's processes per delivery."""
        return self.cpu_seconds / self.messages * 1e6


def wait_until(
    what: str,
    check: Callable[[], bool],
    procs: Sequence[subprocess.Popen[Any]],
    *,
    interval: float = POLL_SECONDS,
    timeout: float = 1800.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def bare_arm(endpoint: str, url: str, plan: Plan) -> Sample:
    sqs = client(endpoint)
    with ExitStack() as stack:
        procs = []
        for _ in range(PROCESSES):
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.sqs", "--bare-loop", endpoint, url],
                cwd=REPO,
                env=child_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.callback(stop, proc)
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != READY:
                raise RuntimeError("a bare receiving process did not start")
        deleted = [0] * len(procs)

        def tally(i: int, out: IO[str]) -> None:
            for line in out:
                if line.strip().isdigit():
                    deleted[i] += int(line)

        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            threading.Thread(target=tally, args=(i, proc.stdout), daemon=True).start()
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)
        started = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{GO}\n")
            proc.stdin.flush()
        wait_until("every message deleted", lambda: sum(deleted) >= plan.messages, procs)
        took = time.perf_counter() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
        # moto may hand one message to two concurrent receives, and both deletes succeed: the
        # sum can reach the backlog early. The queue itself has the last word.
        if not queue_empty(sqs, url):
            wait_until("the queue drained", lambda: queue_empty(sqs, url), procs, interval=1.0)
            took = time.perf_counter() - started
            cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
    return Sample(plan.messages, took, cpu)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def bridge_arm(endpoint: str, url: str, plan: Plan, db_url: str) -> Sample:
    """Two ``fencebridge run`` processes on the queue; until every row has succeeded."""
    empty_work(db_url)
    sqs = client(endpoint)
    with tempfile.TemporaryDirectory(prefix="fencebridge-bench-") as tmp, ExitStack() as stack:
        procs: list[subprocess.Popen[bytes]] = []
        ports = []
        for n in range(PROCESSES):
            port = free_port()
            path = Path(tmp) / f"bridge-{n}.toml"
            path.write_text(
                CONFIG.format(
                    worker=f"bench-{n}",
                    health_port=port,
                    deadline=10,
                    job=JOB,
                    handler="bench.sqs:NoOp",
                    queue_url=url,
                    region=REGION,
                    endpoint=endpoint,
                    ack_mode="after_inbox",
                    visibility=60,
                ),
                encoding="utf-8",
            )
            out: IO[bytes] = stack.enter_context((Path(tmp) / f"bridge-{n}.log").open("wb"))
            proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "--config", str(path)],
                cwd=REPO,
                env=child_env(db_url),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            stack.callback(stop, proc)
            procs.append(proc)
            ports.append(port)
        wait_until("both bridges ready", lambda: all(ready(p) for p in ports), procs, interval=0.05)
        started = time.perf_counter()
        early = work_rows(db_url, succeeded=True)
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)
        wait_until(
            "every row succeeded",
            lambda: work_rows(db_url, succeeded=True) >= plan.messages,
            procs,
        )
        took = time.perf_counter() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
        # Deletes follow each commit at once; counting the queue is slow in moto, so it is
        # checked after the rows, and the clock runs on only if it is not empty yet.
        if not queue_empty(sqs, url):
            wait_until("the queue drained", lambda: queue_empty(sqs, url), procs, interval=1.0)
            took = time.perf_counter() - started
            cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
    return Sample(plan.messages - early, took, cpu)


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
                worker="bench",
                health_port=0,
                deadline=1,
                job=JOB,
                handler="bench.sqs:Busy",
                queue_url=url,
                region=REGION,
                endpoint=endpoint,
                ack_mode="after_outcome",
                # Long enough that no extension is due while the memory is read.
                visibility=MEMORY_VISIBILITY,
            ),
            encoding="utf-8",
        )
        log_file = Path(tmp) / "bridge.log"
        with log_file.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "--config", str(path)],
                cwd=REPO,
                env=child_env(db_url),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until("start-up", lambda: "bridge started" in log_file.read_text(), [proc])
            idle_mb = status_mb(proc.pid, "VmHWM")
            # Every message received and held: all in the table, none visible, all in flight.
            # Polled slowly: moto counts by walking the queue, and it has its hands full.
            wait_until(
                f"{in_flight:,} deliveries held",
                lambda: work_rows(db_url) == in_flight and on_queue(sqs, url) == (0, in_flight),
                [proc],
                interval=2.0,
            )
            peak = status_mb(proc.pid, "VmHWM")  # the high-water mark so far
            held = on_queue(sqs, url)[1]
        finally:
            stop(proc)
    return Memory(idle_mb, peak, held)


# -- the report ------------------------------------------------------------------------------------


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
            "`python -m bench.sqs` ([bench/sqs.py](../bench/sqs.py)): two `fencebridge run`"
            " processes beside two bare boto3 `ReceiveMessage`(10) + `DeleteMessageBatch`"
            " processes, on one local SQS server (moto, its own process) and the same host's"
            f" PostgreSQL. {plan.rounds} interleaved rounds of a {plan.messages:,}-message"
            " backlog per arm, sent beforehand in batches of 10; the bridges run `after_inbox`"
            " with their default eight worker threads and a no-op class B handler, and a round"
            " ends when every row has succeeded and the queue is empty. Each arm's clock starts"
            " once both its processes are up (the bridges: both answer `/readyz`; rows settled"
            " before that are not counted). Medians over rounds (min..max); CPU is the two"
            " processes' user + system time per delivery, moto and PostgreSQL not included."
            " moto's `ReceiveMessage` walks every message of the queue, so its cost falls as a"
            " round drains the queue, the same way in both arms; the benchmark's moto server"
            " keeps a queue's attributes for half a second, as moto otherwise recomputes every"
            " count of the queue several times for each message it sends or returns.",
            "",
            *facts_table(self.facts),
            "",
            "| arm | deliveries/s, end to end | CPU us/delivery |",
            "| --- | ---: | ---: |",
        ]
        for arm in (BARE, BRIDGE):
            samples = self.samples[arm]
            out.append(
                f"| {arm} ({PROCESSES} processes) | {spread([s.rate for s in samples])} "
                f"| {statistics.median(s.cpu_us for s in samples):,.0f} |"
            )
        ratio = statistics.median(self.ratios())
        out += [
            "",
            f"bridge / bare, end to end: median of the per-round ratios {ratio:.2f}x"
            f" ({min(self.ratios()):.2f}..{max(self.ratios()):.2f}).",
        ]
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
                        f" {sample.cpu_us:,.0f} us CPU/delivery"
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
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--moto-server"]:
        serve_moto(int(args_list[1]))
        return 0
    if args_list[:1] == ["--bare-loop"]:
        loop = argparse.ArgumentParser(prog="python -m bench.sqs --bare-loop")
        loop.add_argument("endpoint")
        loop.add_argument("queue_url")
        found = loop.parse_args(args_list[1:])
        return bare_loop(found.endpoint, found.queue_url)
    parser = arguments("bench.sqs", "SQS end to end: two bridges beside two bare loops.")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per arm")
    parser.add_argument("--messages", type=int, help="backlog per arm and round")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS run")
    parser.add_argument(
        "--bare-loop", nargs=2, metavar=("ENDPOINT", "QUEUE_URL"), help=argparse.SUPPRESS
    )
    args, command = command_line(parser, args_list)
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
