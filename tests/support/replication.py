"""A primary and a streaming standby that a test can stall, crash, fail over and rebuild.

Both servers are built from the binaries of the PostgreSQL installed on the machine (``pg_config
--bindir``): ``initdb`` for the first primary, ``pg_basebackup -R`` for every standby, ``pg_ctl
promote`` for a failover. Each runs in its own temporary directory on its own free port and is
torn down with the pair. The standby streams from the primary through a :class:`Proxy` (the
replication link), so a test can stall the link silently (:meth:`Pair.stall`: nothing is
forwarded, nothing is reset, exactly what a congested or partitioned link does) and the primary
runs ahead of its standby while clients get their commits acknowledged.

:meth:`Pair.kill_primary` is ``kill -9`` of the whole primary, :meth:`Pair.promote` promotes the
standby (the server starts a new timeline), :meth:`Pair.rebuild` turns the dead node into the
new primary's standby (a fresh base backup, as an operator or an HA manager does after a
failover whose old primary may hold commits the new one lacks).

Two replication modes: ``async`` (the default of PostgreSQL and of most managed offerings) and
``sync`` (``synchronous_standby_names = '*'``, ``synchronous_commit = on``: a commit returns once
the standby has flushed it). As an HA manager does in its non-strict synchronous mode, a
promoted primary that has no standby yet runs asynchronously until its new standby streams.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

import psycopg

from tests.support.cluster import Cluster, ClusterError
from tests.support.proxy import Proxy

Mode = Literal["async", "sync"]
#: on every server of a pair; the standby's settings must not be lower than its primary's
REPLICATION_SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "512MB",
    "max_connections": "120",
    "wal_receiver_status_interval": "1s",
    "wal_retrieve_retry_interval": "200ms",
}
WAIT_SECONDS = 60.0


def server_binaries() -> Path:
    """The installed server's binaries, as ``pg_config --bindir`` names them."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        raise ClusterError("pg_config is not on PATH: install PostgreSQL's server package")
    bindir = Path(
        subprocess.run(
            [pg_config, "--bindir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    for program in ("initdb", "pg_basebackup", "pg_ctl", "postgres"):
        if not (bindir / program).exists():
            raise ClusterError(f"{bindir} has no {program}: install PostgreSQL's server package")
    return bindir


class Node(Cluster):
    """One server of a pair: a :class:`Cluster` run from the installed server's binaries."""

    def __init__(self, base: Path, *, settings: dict[str, str]) -> None:
        super().__init__(base, settings=settings)
        self._bin = server_binaries()
        self._as_user = _server_user()

    def run(self, args: list[str]) -> None:
        """Run one of the server's programs as the server's user; its output goes to the log."""
        with self.log.open("ab") as log:
            subprocess.run(
                self._command([str(self._bin / args[0]), *args[1:]]),
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=WAIT_SECONDS * 2,
                **self._user_kwargs(),
            )

    def base_backup_from(self, host: str, port: int) -> None:
        """Become a standby of ``host:port``: a base backup with ``-R`` (standby.signal and
        ``primary_conninfo`` written), streaming the WAL it needs alongside."""
        shutil.rmtree(self.data, ignore_errors=True)
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_user is not None:
            for path in (self.base, self.sockets):
                os.chown(path, *self._as_user)
        self.run(
            [
                "pg_basebackup",
                "-D",
                str(self.data),
                "-d",
                f"host={host} port={port} user=postgres application_name=standby",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]
        )

    def promote(self) -> None:
        """``pg_ctl promote``: ends recovery and starts a new timeline; waits until writable."""
        self.run(["pg_ctl", "promote", "-w", "-t", str(int(WAIT_SECONDS)), "-D", str(self.data)])
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            with psycopg.connect(self.url(), connect_timeout=2, autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                if row is not None and not row[0]:
                    return
            time.sleep(0.05)
        raise ClusterError(f"the standby did not leave recovery:\n{self.log_tail()}")

    def execute(self, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []


class Pair:
    """A primary and its streaming standby, the standby's link through a proxy."""

    def __init__(self, base: Path, *, mode: Mode = "async") -> None:
        self.base = base
        self.mode = mode
        self.nodes = [
            Node(base / "a", settings=REPLICATION_SETTINGS),
            Node(base / "b", settings=REPLICATION_SETTINGS),
        ]
        self.primary, self.standby = self.nodes
        self.link: Proxy | None = None
        self.failovers = 0

    # -- building --------------------------------------------------------------------------

    def start(self) -> None:
        self.primary.base.mkdir(parents=True, exist_ok=True)
        self.primary.init()
        self.primary.start()
        self._attach_standby()

    def _attach_standby(self) -> None:
        """Base-back-up the standby from the primary through a new link, start it, wait until
        it streams; in ``sync`` mode, make the primary wait for it from then on."""
        if self.link is not None:
            self.link.stop()
        self.link = Proxy(self.primary.host, self.primary.port)
        self.link.start()
        self.standby.base.mkdir(parents=True, exist_ok=True)
        self.standby.base_backup_from(self.link.host, self.link.port)
        self.standby.start()
        self.wait_streaming()
        if self.mode == "sync":
            self.primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.execute("SELECT pg_reload_conf()")
            self._wait_for(
                lambda: (
                    self.primary.execute(
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                    )[0][0]
                    == 1
                ),
                "the standby to become synchronous",
            )

    def destroy(self) -> None:
        if self.link is not None:
            self.link.heal()
            self.link.stop()
        for node in self.nodes:
            with suppress(Exception):
                node.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- facts -----------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """A multi-host URL naming both servers, connecting to whichever one takes writes."""
        hosts = ",".join(f"{n.host}:{n.port}" for n in self.nodes)
        query = "&".join(
            f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items()
        )
        return f"postgresql://postgres@{hosts}/{dbname}?{query}"

    def lag_bytes(self) -> int:
        """How far the standby's replay is behind the primary's WAL (0 when caught up)."""
        rows = self.primary.execute(
            "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), -1)::bigint"
            "  FROM pg_stat_replication"
        )
        return int(rows[0][0])  # type: ignore[call-overload]

    def timeline(self) -> int:
        rows = self.primary.execute(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        )
        return int(rows[0][0])  # type: ignore[call-overload]

    # -- faults ----------------------------------------------------------------------------

    def stall(self) -> None:
        """Hang the replication link: the standby receives nothing more, nobody is told."""
        assert self.link is not None
        self.link.hang()

    def resume(self) -> None:
        assert self.link is not None
        self.link.heal()

    def kill_primary(self) -> None:
        """``kill -9`` of the primary's postmaster and every backend."""
        self.primary.kill()

    def promote(self) -> None:
        """Promote the standby: it becomes the primary, the dead node waits to be rebuilt."""
        if self.link is not None:
            self.link.stop()
            self.link = None
        self.standby.promote()
        if self.mode == "sync":  # nobody to wait for until the new standby streams
            self.standby.execute("ALTER SYSTEM RESET synchronous_standby_names")
            self.standby.execute("SELECT pg_reload_conf()")
        self.primary, self.standby = self.standby, self.primary
        self.failovers += 1

    def rebuild(self) -> None:
        """The old primary (dead, or stopped here) as the new primary's standby."""
        self.standby.kill()
        self._attach_standby()

    def failover(self) -> None:
        self.kill_primary()
        self.promote()
        self.rebuild()

    # -- waiting ---------------------------------------------------------------------------

    def wait_streaming(self) -> None:
        self._wait_for(
            lambda: (
                self.primary.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                )[0][0]
                == 1
            ),
            "the standby to stream",
        )

    def wait_caught_up(self) -> None:
        self._wait_for(lambda: self.lag_bytes() == 0, "the standby to catch up")

    def _wait_for(self, condition: object, what: str) -> None:
        assert callable(condition)
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.05)
        raise ClusterError(
            f"timed out waiting for {what}:\n{self.primary.log_tail()}\n{self.standby.log_tail()}"
        )


def _server_user() -> tuple[int, int] | None:
    """Under root: the installed server's own ``postgres`` user (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


@contextmanager
def replicated_pair(mode: Mode = "async") -> Iterator[Pair]:
    """A started primary and streaming standby for the ``with`` block, destroyed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="fbr-"))
    os.chmod(base, 0o755)
    pair = Pair(base, mode=mode)
    try:
        pair.start()
        yield pair
    finally:
        pair.destroy()
