"""A Patroni cluster for tests: one etcd, two PostgreSQL nodes, each managed by its own Patroni.

As teams run it on their own hosts: Debian's ``patroni`` (``FENCEBRIDGE_PATRONI`` or ``patroni``
on ``PATH``) with a real etcd (tests/support/etcd_server.py) as its store through etcd's v3 API,
and PostgreSQL from the installed server's binaries (``pg_config --bindir``). Each node has its
own data dir, PostgreSQL port and REST API port on loopback; under root, Patroni and the servers
it starts run as the ``postgres`` user (PostgreSQL refuses root), like tests/support/replication.py.

The cluster is in Patroni's ``synchronous_mode`` (the mode its docs call safe: a standby is
promoted only if it is the synchronous one, so it holds every acknowledged commit), not strict
(the leader writes on while its only standby is down, and fails over to nobody meanwhile), with
``primary_start_timeout: 0``: a leader whose server crashed fails over at once rather than
restarting it. The old leader comes back as a replica, with ``pg_rewind`` or, where that fails,
a fresh copy, as Patroni decides. ``ttl``, ``loop_wait`` and ``retry_timeout`` are small, so a
failover takes seconds.

:meth:`PatroniCluster.fail_over` kills the leader's server (``kill -9`` of the postmaster and
every backend; Patroni and its etcd lease live on) and waits while Patroni, not the test, makes
the other node the leader and the old one its streaming synchronous standby again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.support.cluster import free_port
from tests.support.etcd_server import EtcdServer, etcd_server, require_etcd
from tests.support.replication import server_binaries
from tests.support.waiting import eventually

PATRONI_ENV = "FENCEBRIDGE_PATRONI"
NODES = 2
#: how long a start, a failover or a rejoin may take before the test fails naming it
WAIT_SECONDS = 120.0
STOP_SECONDS = 30.0
SUBREAPER = Path(__file__).with_name("subreaper.py")
PARAMETERS = {
    "wal_level": "replica",
    "hot_standby": "on",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "512MB",
    "wal_log_hints": "on",
    "max_connections": 120,
    "shared_buffers": "32MB",
    "fsync": "off",
    "wal_receiver_status_interval": "1s",
    "wal_retrieve_retry_interval": "200ms",
}
TRUST = [
    "local all all trust",
    "host all all 127.0.0.1/32 trust",
    "host replication all 127.0.0.1/32 trust",
]


def require_patroni() -> Path:
    """The ``patroni`` program; otherwise skip the test, or fail it under CI (``CI=true``)."""
    configured = os.environ.get(PATRONI_ENV)
    found = configured or shutil.which("patroni")
    if found and Path(found).is_file():
        return Path(found)
    reason = (
        f"patroni unavailable: {PATRONI_ENV}={configured} is no file"
        if configured
        else "patroni unavailable: no patroni on PATH (apt-get install patroni)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True, slots=True)
class Failover:
    """One failover, timed from the kill."""

    old_leader: str
    new_leader: str
    #: until the new leader's server takes writes
    to_new_leader: float
    #: until the old leader streams again as the new one's synchronous standby
    to_replicated: float


class PatroniNode:
    """One Patroni and the PostgreSQL server it manages, under a subreaper of its own."""

    def __init__(self, base: Path, name: str, patroni: Path) -> None:
        self.base = base
        self.name = name
        self.data = base / "data"
        self.port = free_port()
        self.api = f"http://127.0.0.1:{free_port()}"
        self._patroni = patroni
        self._log = base / "patroni.log"
        self._proc: psutil.Popen | None = None

    def write_config(self, scope: str, etcd: EtcdServer, bindir: Path) -> Path:
        api = self.api.removeprefix("http://")
        config = {
            "scope": scope,
            "namespace": "/fencebridge-test/",
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": api, "connect_address": api},
            "etcd3": {"hosts": [etcd.url.removeprefix("http://")]},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 4,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": False,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "remove_data_directory_on_rewind_failure": True,
                        "remove_data_directory_on_diverged_timelines": True,
                        "parameters": PARAMETERS,
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data),
                "bin_dir": str(bindir),
                "pgpass": str(self.base / "pgpass"),
                "pg_hba": TRUST,
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "basebackup": [{"checkpoint": "fast"}],
                "parameters": {"unix_socket_directories": str(self.base)},
            },
            "watchdog": {"mode": "off"},
        }
        path = self.base / "patroni.yml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def start(self) -> None:
        """Patroni on the written configuration, its output (and its server's) to the log."""
        command = [sys.executable, str(SUBREAPER), *_as_server_user(), str(self._patroni)]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base),
            "LC_ALL": "C.UTF-8",
        }
        with self._log.open("ab") as log:
            self._proc = psutil.Popen(
                [*command, str(self.base / "patroni.yml")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,  # a Ctrl-C of the test run reaches the teardown only
            )

    # -- facts -------------------------------------------------------------------------------

    def get(self, path: str) -> Any:
        """The REST API's answer to ``GET path`` (its body even on an error status)."""
        try:
            with urllib.request.urlopen(f"{self.api}{path}", timeout=2) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return json.loads(error.read() or b"null")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def execute(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=2) as conn:
            cur = conn.execute(statement.encode())
            return cur.fetchall() if cur.description else []

    def log_text(self) -> str:
        """Patroni's log and its server's (the server writes to Patroni's output)."""
        with suppress(OSError):
            return self._log.read_text(errors="replace")
        return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- faults and teardown -----------------------------------------------------------------

    def kill_postgres(self) -> None:
        """``kill -9`` of the server: the postmaster frozen, then it and every backend killed."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        postmaster.suspend()
        victims = [*postmaster.children(recursive=True), postmaster]
        _kill(victims)

    def stop(self) -> None:
        """Patroni asked to stop (it stops its server); whatever is left after a while, killed."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with suppress(psutil.NoSuchProcess):
            proc.terminate()  # the subreaper hands it to Patroni
        try:
            proc.wait(STOP_SECONDS)
        except psutil.TimeoutExpired:
            with suppress(psutil.NoSuchProcess):
                _kill(proc.children(recursive=True))  # all of it: orphans stay below the reaper
            proc.kill()
            proc.wait(STOP_SECONDS)


class PatroniCluster:
    """The nodes, their etcd, and the leader as Patroni's REST API names it."""

    def __init__(self, base: Path, etcd: EtcdServer, patroni: Path) -> None:
        self.etcd = etcd
        self.scope = f"fb-{uuid.uuid4().hex[:8]}"
        self.nodes = [PatroniNode(base / f"node{n}", f"node{n}", patroni) for n in range(NODES)]
        self.failovers: list[Failover] = []
        bindir = server_binaries()
        owner = _server_user()
        for node in self.nodes:
            node.base.mkdir()
            config = node.write_config(self.scope, etcd, bindir)
            if owner is not None:
                for path in (node.base, config):
                    os.chown(path, *owner)

    def start(self) -> None:
        """The first node bootstraps the cluster; the others copy it once it leads."""
        self.nodes[0].start()
        self._wait(lambda: self._leader_name() == self.nodes[0].name, "the first node to lead")
        for node in self.nodes[1:]:
            node.start()
        self.wait_replicated()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    # -- facts -------------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """A multi-host URL naming every node, connecting to whichever one takes writes."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        query = "&".join(
            f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items()
        )
        return f"postgresql://postgres@{hosts}/{dbname}?{query}"

    def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` from the first node that answers: the members as etcd has them."""
        for node in self.nodes:
            with suppress(OSError, ValueError):
                members: list[dict[str, Any]] = node.get("/cluster")["members"]
                return members
        return []

    def leader(self) -> PatroniNode:
        name = self._leader_name()
        return next(n for n in self.nodes if n.name == name)

    def _leader_name(self) -> str | None:
        leaders = [m["name"] for m in self.running() if m["role"] == "leader"]
        return leaders[0] if leaders else None

    def running(self) -> list[dict[str, Any]]:
        """The members whose server runs, as their Patroni last told etcd."""
        return [m for m in self.members() if m["state"] == "running"]

    def rejoins(self) -> dict[str, int]:
        """How Patroni brought old leaders back, from its logs: the ``pg_rewind`` runs, and the
        data directories it removed for a fresh copy (a rewind that failed, diverged timelines).
        A leader whose server had written nothing its successor lacks comes back without either."""
        logs = "".join(n.log_text() for n in self.nodes)
        return {
            "pg_rewind": logs.count("running pg_rewind from"),
            "fresh_copy": logs.count("is set. removing...")
            + logs.count("reinitializing due to diverged timelines"),
        }

    # -- failing over ------------------------------------------------------------------------

    def fail_over(self) -> Failover:
        """Kill the leader's server; wait while Patroni elects the other node, then rejoins
        this one as its standby."""
        old = self.leader()
        killed = time.monotonic()
        old.kill_postgres()
        self._wait(lambda: self._writable_leader(besides=old.name), "Patroni to elect a new leader")
        elected = time.monotonic()
        new = self._leader_name()
        self.wait_replicated()
        failover = Failover(old.name, str(new), elected - killed, time.monotonic() - killed)
        self.failovers.append(failover)
        return failover

    def _writable_leader(self, *, besides: str) -> bool:
        name = self._leader_name()
        if name is None or name == besides:
            return False
        with suppress(psycopg.OperationalError):
            return not self.leader().execute("SELECT pg_is_in_recovery()")[0][0]
        return False

    def wait_replicated(self) -> None:
        """Until every other node is the leader's synchronous standby and streams from it."""

        def replicated() -> bool:
            standbys = [m for m in self.running() if m["role"] == "sync_standby"]
            if len(standbys) != NODES - 1 or self._leader_name() is None:
                return False
            with suppress(psycopg.OperationalError):
                rows = self.leader().execute(
                    "SELECT count(*) FROM pg_stat_replication"
                    " WHERE state = 'streaming' AND sync_state = 'sync'"
                )
                return bool(rows[0][0] == NODES - 1)
            return False

        self._wait(replicated, "a leader with a streaming synchronous standby")

    def _wait(self, check: Any, what: str) -> None:
        try:
            eventually(check, what, WAIT_SECONDS, poll=0.1)
        except AssertionError as failure:
            logs = "\n".join(f"--- {n.name}:\n{n.log_tail()}" for n in self.nodes)
            raise AssertionError(f"{failure}\nmembers: {self.members()}\n{logs}") from None


def _server_user() -> tuple[int, int] | None:
    """Under root: the ``postgres`` user's ids (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    import pwd  # noqa: PLC0415

    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def _as_server_user() -> list[str]:
    """The prefix that runs a program as the server's user (nothing when not root)."""
    owner = _server_user()
    setpriv = shutil.which("setpriv")
    if owner is None:
        return []
    if setpriv is None:
        raise RuntimeError("running as root needs setpriv (util-linux) to run Patroni as postgres")
    uid, gid = owner
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with suppress(psutil.NoSuchProcess):
            proc.kill()
    _, alive = psutil.wait_procs(procs, timeout=STOP_SECONDS)
    assert not alive, f"processes survived SIGKILL: {alive}"


@contextmanager
def patroni_cluster() -> Iterator[PatroniCluster]:
    """An etcd and a Patroni cluster with a leader and a synchronous standby for the block;
    every process stopped (or killed) and every file removed afterwards, whatever happened."""
    patroni = require_patroni()
    base = Path(tempfile.mkdtemp(prefix="fbp-"))
    os.chmod(base, 0o755)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        etcd = stack.enter_context(etcd_server(require_etcd()))
        cluster = PatroniCluster(base, etcd, patroni)
        stack.callback(cluster.stop)  # before etcd stops: Patroni gives its leader key back
        cluster.start()
        yield cluster
