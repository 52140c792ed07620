"""One worker as a real process, driven by a test through gates on its stdin.

Run as ``python -m tests.support.worker_process --database-url URL --job JOB --tenant T
--operation OP [--gate POINT ...]``. The process claims (``claim_keys`` for the one key, or
``claim`` for any row of the job type), runs :func:`bridge.executors.execute` on what it got
and reports on stdout, one flushed line at a time::

    claimed fence=2 attempts=2 takeover=true   (or: claimed none, and it exits)
    at claimed                                 after the claim, before executing
    at handler                                 the handler (perform, call) was entered
    at effect                                  the effect happened; the handler has not returned
    result {"lease_lost": 1}                   the EventCounter after execute; then it exits 0

At every point named with ``--gate`` it waits for a line ``go`` on stdin. Gates are how a test
orders two workers without sleeping; the faults themselves are real signals sent by the test
(SIGSTOP/SIGCONT for a pause, SIGKILL for a crash), see :class:`WorkerProcess`.

The process runs no heartbeat and keeps no local trust window: it behaves like a worker whose
pause landed right after its last look at the clock, the worst case, so what stops a stale write
is only what the database or the target decides inside the write.

The idempotency key secret comes from ``FENCEBRIDGE_IDENTITY_KEY``: every worker process of a
test must derive the same key for an operation, as every replica of a deployment must.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO

from bridge.database import Connection
from bridge.demo import balances, invoices, payments
from bridge.demo.provider import PaymentClient
from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import JobSpec, Registry
from bridge.handlers import Context, RetryPolicy, Success, UnfencedHandler
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.types import Claim, Key
from tests.support.processes import ChildProcess

REPO = Path(__file__).resolve().parents[2]
POINTS = ("claimed", "handler", "effect")
NOTIFY_JOB = "notify"
EXPECT_SECONDS = 60.0


def context_for(claim: Claim, hasher: IdentityHasher) -> Context:
    """The context a worker builds for a claim (as :class:`bridge.runtime.worker.WorkerPool`
    does)."""
    return Context.for_claim(claim, hasher)


# -- the process --------------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


class Gates:
    """Announces every point it reaches; waits for ``go`` on stdin at the gated ones."""

    def __init__(self, gated: Sequence[str]) -> None:
        self._gated = set(gated)

    def reach(self, point: str) -> None:
        say(f"at {point}")
        if point in self._gated:
            line = sys.stdin.readline()
            if line.strip() != "go":
                raise SystemExit(f"gate {point}: expected 'go', got {line!r}")


class AppendToSink(UnfencedHandler):
    """A class D target with no fence, no key and no lookup: a line appended to a file."""

    def __init__(self, sink: Path) -> None:
        self._sink = sink

    def call(self, ctx: Context) -> Success:
        with self._sink.open("a", encoding="utf-8") as f:
            f.write(f"{ctx.tenant_id} {ctx.operation_id} fence={ctx.fence}\n")
            f.flush()
            os.fsync(f.fileno())
        return Success("notified")


def gated_registry(args: argparse.Namespace, store: PostgresStore, gates: Gates) -> JobSpec:
    """The one job this process runs, its handler wrapped so the gates sit around the effect."""
    lease = timedelta(seconds=args.lease)
    registry = Registry()

    class GatedRefund(invoices.RefundInvoice):
        def handle(self, ctx: Context, tx: Connection) -> Success:
            gates.reach("handler")
            result = super().handle(ctx, tx)
            gates.reach("effect")  # inside the transaction: the refund is written, not committed
            return result

    class GatedBalance(balances.SetBalance):
        def handle(self, ctx: Context) -> Success:
            gates.reach("handler")
            result = super().handle(ctx)
            gates.reach("effect")
            return result

    class GatedCharge(payments.ChargeCustomer):
        def perform(self, ctx: Context, key: str) -> Success:
            gates.reach("handler")
            result = super().perform(ctx, key)
            gates.reach("effect")  # the provider has charged; nothing is recorded yet
            return result

    class GatedSink(AppendToSink):
        def call(self, ctx: Context) -> Success:
            gates.reach("handler")
            result = super().call(ctx)
            gates.reach("effect")
            return result

    if args.job == invoices.JOB_TYPE:
        return registry.register(args.job, GatedRefund(), lease=lease)
    if args.job == balances.JOB_TYPE:
        return registry.register(args.job, GatedBalance(store.pool.connection), lease=lease)
    if args.job == payments.JOB_TYPE:
        if not args.provider_url:
            raise SystemExit("--provider-url is required for the charge job")
        client = PaymentClient(args.provider_url, timeout=args.provider_timeout)
        return registry.register(args.job, GatedCharge(client), lease=lease)
    if args.job == NOTIFY_JOB:
        if not args.sink:
            raise SystemExit("--sink is required for the notify job")
        return registry.register(
            args.job, GatedSink(Path(args.sink)), lease=lease, retry=RetryPolicy(max_attempts=1)
        )
    raise SystemExit(f"unknown job {args.job!r}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    jobs = (invoices.JOB_TYPE, balances.JOB_TYPE, payments.JOB_TYPE, NOTIFY_JOB)
    p = argparse.ArgumentParser(prog="python -m tests.support.worker_process")
    p.add_argument("--database-url", required=True)
    p.add_argument("--job", required=True, choices=jobs)
    p.add_argument("--tenant", required=True)
    p.add_argument("--operation", required=True)
    p.add_argument("--worker-id", default=f"worker-{os.getpid()}")
    p.add_argument("--lease", type=float, default=1.0, help="lease in seconds")
    p.add_argument("--claim", choices=("key", "any"), default="key")
    p.add_argument("--gate", action="append", default=[], choices=POINTS)
    p.add_argument("--provider-url")
    p.add_argument("--provider-timeout", type=float, default=2.0)
    p.add_argument("--sink")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    hasher = IdentityHasher.from_env()
    gates = Gates(args.gate)
    store = PostgresStore.connect(args.database_url, min_size=1, max_size=2)
    try:
        spec = gated_registry(args, store, gates)
        if args.claim == "key":
            key = Key(args.tenant, args.operation)
            claims = store.claims.claim_keys(args.worker_id, [key], spec.lease)
        else:
            claims = store.claims.claim(args.worker_id, 1, spec.lease, job_types=[spec.job_type])
        if not claims:
            say("claimed none")
            return 0
        (claim,) = claims
        takeover = "true" if claim.takeover else "false"
        say(f"claimed fence={claim.fence} attempts={claim.attempts} takeover={takeover}")
        gates.reach("claimed")
        events = EventCounter()
        execute(Run(store.settle, claim, spec, context_for(claim, hasher), events))
        say("result " + json.dumps(events.snapshot(), sort_keys=True))
    finally:
        store.close()
    return 0


# -- the test's side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    fence: int
    attempts: int
    takeover: bool


class WorkerProcess(ChildProcess):
    """A started worker process and the test's controls over it."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.worker_process", *args],
            cwd=REPO,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._buffer = b""
        #: every line the process printed so far
        self.lines: list[str] = []

    def _release(self) -> None:
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

    # reading

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def _read_line(self, deadline: float) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"worker {self.pid}: no line in time; printed {self.lines}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                self._proc.wait()
                raise AssertionError(
                    f"worker {self.pid} exited ({self._proc.returncode}) after {self.lines}; "
                    f"stderr:\n{self.stderr()}"
                )
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\n")
        line = raw.decode()
        self.lines.append(line)
        return line

    def expect(self, prefix: str, timeout: float = EXPECT_SECONDS) -> str:
        """Read until a line starting with ``prefix``; returns the rest of that line."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._read_line(deadline)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def claimed(self) -> Claimed | None:
        rest = self.expect("claimed ")
        if rest == "none":
            return None
        fields = dict(part.split("=", 1) for part in rest.split())
        return Claimed(int(fields["fence"]), int(fields["attempts"]), fields["takeover"] == "true")

    def at(self, point: str) -> None:
        """Wait until the process reached ``point`` (and, if gated there, waits for ``go``)."""
        self.expect(f"at {point}")

    def reached(self, point: str) -> bool:
        """Whether the process announced ``point`` among the lines read so far."""
        return f"at {point}" in self.lines

    def result(self, timeout: float = EXPECT_SECONDS) -> dict[str, int]:
        """The event counts it printed; it must then exit cleanly."""
        counts: dict[str, int] = json.loads(self.expect("result ", timeout))
        assert self._proc.wait(timeout=timeout) == 0, self.stderr()
        return counts

    def finished(self, timeout: float = EXPECT_SECONDS) -> int:
        return self._proc.wait(timeout=timeout)

    # controls

    def go(self) -> None:
        """Open the gate the process is waiting at."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(b"go\n")
        self._proc.stdin.flush()

    def pause(self, timeout: float = EXPECT_SECONDS) -> None:
        """SIGSTOP, and wait until the kernel reports the process stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while _process_state(self.pid) != "T":
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.pid} did not stop")
            time.sleep(0.01)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _process_state(pid: int) -> str:
    """The one-letter state from /proc/<pid>/stat (``T`` is stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


if __name__ == "__main__":
    raise SystemExit(main())
