"""A real etcd server for tests: one member on free loopback ports, in a temporary data dir.

The binary is Debian's ``etcd-server`` package (``etcd`` on ``PATH``, or ``FENCEBRIDGE_ETCD``);
``.ci/run`` installs it when it is missing. Without it, tests that need it are skipped, except in
CI (``CI=true``), where a missing server fails the run instead of silently skipping it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from bridge.demo.emulator import free_port
from bridge.targets.etcd import EtcdClient, EtcdRequestError
from tests.support.processes import ChildProcess
from tests.support.waiting import eventually

ETCD_ENV = "FENCEBRIDGE_ETCD"
START_TIMEOUT = 60.0


def find_etcd() -> tuple[Path | None, str]:
    """The etcd binary, or ``None`` and why it was not found."""
    configured = os.environ.get(ETCD_ENV)
    if configured:
        path = Path(configured)
        return (path, "") if path.is_file() else (None, f"{ETCD_ENV}={configured} is no file")
    found = shutil.which("etcd")
    if found is None:
        return None, "no etcd on PATH (apt-get install etcd-server)"
    return Path(found), ""


def require_etcd() -> Path:
    """The binary; otherwise skip the test, or fail it under CI."""
    binary, why = find_etcd()
    if binary is not None:
        return binary
    reason = f"etcd unavailable: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class EtcdServer(ChildProcess):
    """One etcd member on loopback; ``client`` talks to it through its JSON gateway."""

    def __init__(self, binary: Path) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="fencebridge-etcd-")
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  (closed in _release)
        client_port, peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client_port}"
        # a name of its own: the server that answers on the port must be this one, not another
        # test process's etcd that took the port first (this one then fails to bind and exits)
        self.name = f"test-{os.getpid()}-{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._proc = subprocess.Popen(
            [
                str(binary),
                f"--name={self.name}",
                f"--data-dir={self._dir.name}/data",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.name}={peer}",
                "--logger=zap",
                "--log-level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.client = EtcdClient(self.url, timeout=5.0)

    def _members(self) -> list[str]:
        """The names of the members of the cluster answering on this server's client port."""
        request = urllib.request.Request(
            f"{self.url}/v3/cluster/member/list", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            found = json.loads(answer.read())
        return [str(m.get("name", "")) for m in found.get("members", [])]

    def wait_ready(self) -> None:
        def answers() -> bool:
            if self._proc.poll() is not None:
                raise AssertionError(f"etcd exited ({self._proc.returncode}):\n{self.log()}")
            try:
                self.client.get(b"fencebridge-test/ready")
                return self.name in self._members()
            except (OSError, EtcdRequestError):
                return False

        eventually(answers, "etcd to answer on its client port", timeout=START_TIMEOUT)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections; etcd reads and answers nothing."""
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def _release(self) -> None:
        self._log.close()
        self._dir.cleanup()


@contextmanager
def etcd_server(binary: Path) -> Iterator[EtcdServer]:
    """A started etcd, stopped (and its data dir removed) on exit."""
    with EtcdServer(binary) as server:
        server.wait_ready()
        yield server
