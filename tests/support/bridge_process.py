"""``fencebridge run`` as a real process: its configuration file, environment, probes and signals.

A test describes the bridge with :class:`SqsBridgeConfig` (one SQS subscription and its job
types), writes it into its temporary directory and starts ``python -m bridge run --config FILE``
with :class:`BridgeProcess`. The process gets the database URL and the identity key from the
environment, as in production, and dummy AWS credentials for the local SQS server. Its output
goes to a log file the test can read at any time (:meth:`BridgeProcess.logs`), so nothing blocks
on a full pipe. Faults are real signals: :meth:`BridgeProcess.terminate` is SIGTERM (drain and
exit), :meth:`BridgeProcess.kill` is SIGKILL (a crash, nothing runs after it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from bridge import sql as bridge_sql
from bridge.database import DATABASE_URL_ENV
from bridge.identity import IDENTITY_KEY_ENV, fingerprint
from tests.support.handlers import TARGET_URL_ENV
from tests.support.processes import REAP_SECONDS, ChildProcess

REPO = Path(__file__).resolve().parents[2]
#: the same key in every bridge process of a test, as in every replica of a deployment
IDENTITY_KEY = "test-identity-key-0123456789abcdef"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}
READY_SECONDS = 60.0
EXIT_SECONDS = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class Job:
    """One ``[jobs.<name>]`` table."""

    handler: str
    target_class: str
    lease_seconds: float = 5.0
    max_attempts: int = 5


def jobs_toml(jobs: Mapping[str, Job]) -> tuple[str, str]:
    """The ``[jobs.<name>]`` tables and the quoted list of their names, for a subscription."""
    tables = "".join(
        f"""
[jobs.{name}]
handler = "{job.handler}"
target_class = "{job.target_class}"
lease_seconds = {job.lease_seconds}
max_attempts = {job.max_attempts}
backoff_initial_seconds = 0.2
backoff_max_seconds = 1.0
"""
        for name, job in jobs.items()
    )
    return tables, ", ".join(f'"{name}"' for name in jobs)


@dataclass(frozen=True, slots=True, kw_only=True)
class SqsBridgeConfig:
    """A bridge with one SQS subscription, decoding tenant and operation from attributes."""

    queue_url: str
    endpoint_url: str
    jobs: Mapping[str, Job]
    health_port: int = field(default_factory=free_port)
    subscription: str = "orders"
    ack_mode: str = "after_inbox"
    visibility_timeout_seconds: int = 5
    wait_seconds: int = 1
    worker_threads: int = 4
    poll_interval_seconds: float = 0.2
    sweep_interval_seconds: float = 1.0
    shutdown_deadline_seconds: float = 5.0
    worker_id: str | None = None
    #: more ``[bridge]`` keys (``tcp_user_timeout_seconds = 3.0``, say)
    settings: Mapping[str, float] = field(default_factory=dict)

    def toml(self) -> str:
        worker = f'worker_id = "{self.worker_id}"\n' if self.worker_id else ""
        worker += "".join(f"{key} = {value}\n" for key, value in self.settings.items())
        jobs, job_types = jobs_toml(self.jobs)
        return f"""[bridge]
{worker}worker_threads = {self.worker_threads}
poll_interval_seconds = {self.poll_interval_seconds}
sweep_interval_seconds = {self.sweep_interval_seconds}
shutdown_deadline_seconds = {self.shutdown_deadline_seconds}
health_port = {self.health_port}
{jobs}
[subscriptions.{self.subscription}]
source = "sqs"
queue_url = "{self.queue_url}"
region = "us-east-1"
endpoint_url = "{self.endpoint_url}"
ack_mode = "{self.ack_mode}"
wait_seconds = {self.wait_seconds}
visibility_timeout_seconds = {self.visibility_timeout_seconds}
job_types = [{job_types}]

[subscriptions.{self.subscription}.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "attribute:job_type"
payload = "body"
"""

    def write(self, directory: Path, name: str = "bridge.toml") -> Path:
        path = directory / name
        path.write_text(self.toml(), encoding="utf-8")
        return path


def bridge_env(
    database_url: str | None,
    *,
    target_url: str | None = None,
    identity_key: str | None = IDENTITY_KEY,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The process environment: this one without any FENCEBRIDGE_/PG/AWS settings, plus ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG", "AWS_"))}
    env.update(AWS_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    if database_url is not None:
        env[DATABASE_URL_ENV] = database_url
    if identity_key is not None:
        env[IDENTITY_KEY_ENV] = identity_key
    if target_url is not None:
        env[TARGET_URL_ENV] = target_url
    env.update(extra or {})
    return env


def scrape(port: int, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels`` (0 if none).

    The bridge serves its metrics when ``FENCEBRIDGE_PROMETHEUS_PORT`` is in its environment.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        found = dict(_LABEL.findall(rest))
        if metric == name and all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def fencebridge(
    env: Mapping[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """One ``fencebridge`` command as a process, to its exit; its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_to_exit(
    config: Path, env: Mapping[str, str], timeout: float = EXIT_SECONDS
) -> subprocess.CompletedProcess[str]:
    """``fencebridge run`` for a start-up that must fail: wait for it to exit by itself."""
    return fencebridge(env, "run", "--config", str(config), timeout=timeout)


def record_identity_key(env: Mapping[str, str]) -> None:
    """What ``fencebridge identity init`` does before a deployment's first ``run``: record the
    environment's key as key 1, unless a key is recorded already (then ``run`` compares)."""
    url, key = env.get(DATABASE_URL_ENV), env.get(IDENTITY_KEY_ENV)
    if not url or not key:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            bridge_sql.statement("identity_init"),
            {"fingerprint": fingerprint(key.encode()), "actor": "test", "reason": "test setup"},
        )


class BridgeProcess(ChildProcess):
    """A started ``fencebridge run`` and the test's controls over it (its database's identity
    key recorded first, as a deployment's first step does)."""

    def __init__(
        self,
        config: Path,
        env: Mapping[str, str],
        *,
        health_port: int,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix``: a command the bridge runs under (``faketime -f +600s``, say)."""
        record_identity_key(env)
        self.log_path = config.with_name(f"{config.stem}-{time.monotonic_ns()}.log")
        self._log: IO[bytes] = self.log_path.open("wb")
        self.health_port = health_port
        # A prefix such as faketime forks the bridge and waits for it, passing no signal on: the
        # bridge then runs in a process group of its own, and a kill goes to the whole group.
        self._group = bool(prefix)
        self._proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "bridge", "run", "--config", str(config)],
            cwd=REPO,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self._group,
        )

    def kill(self) -> None:
        """SIGKILL to the bridge (and, under a prefix, to everything it runs under)."""
        if not self._group:
            super().kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        assert self._proc.wait(timeout=REAP_SECONDS) == -signal.SIGKILL

    def close(self) -> None:
        if self._group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        super().close()

    @classmethod
    def start(
        cls, config: SqsBridgeConfig, directory: Path, env: Mapping[str, str]
    ) -> BridgeProcess:
        # One file per bridge: two bridges of a test in one directory must not share one.
        name = f"{config.worker_id or 'bridge'}-{config.health_port}.toml"
        return cls(config.write(directory, name), env, health_port=config.health_port)

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def _release(self) -> None:
        self._log.close()

    def logs(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    # probes

    def probe(self, path: str, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        """GET ``path`` on the health port: the status and the JSON body."""
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, json.loads(error.read())

    def wait_for(self, path: str, status: int, timeout: float = READY_SECONDS) -> dict[str, Any]:
        """Poll ``path`` until it answers ``status``; the body of that answer."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise AssertionError(
                    f"bridge exited ({self._proc.returncode}) while waiting for {path} "
                    f"{status}; log:\n{self.logs()}"
                )
            try:
                code, body = self.probe(path)
            except (OSError, ValueError) as exc:
                last = exc
            else:
                if code == status:
                    return body
                last = (code, body)
            time.sleep(0.1)
        raise AssertionError(f"{path} never answered {status} (last: {last}); log:\n{self.logs()}")

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        self.wait_for("/readyz", 200, timeout)

    def wait_log(self, text: str, timeout: float = READY_SECONDS, count: int = 1) -> None:
        """Wait until ``text`` appears ``count`` times in the log."""
        deadline = time.monotonic() + timeout
        while self.logs().count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged {count}x; log:\n{self.logs()}")
            if self._proc.poll() is not None and self.logs().count(text) < count:
                raise AssertionError(f"bridge exited before logging {text!r}:\n{self.logs()}")
            time.sleep(0.05)

    # signals

    def terminate(self, timeout: float = EXIT_SECONDS) -> int:
        """SIGTERM: stop receiving, drain, exit. Returns the exit code."""
        self._proc.send_signal(signal.SIGTERM)
        return self._proc.wait(timeout=timeout)
