"""A throwaway PostgreSQL server that a test may crash with SIGKILL and bring back.

The server runs from the embedded binaries (PostgreSQL 16 from the ``pgserver`` wheel) in a
temporary directory, listening on 127.0.0.1 on a free port. The test holds the postmaster as a
child process: :meth:`Cluster.kill` is a hard crash of the whole server (postmaster and every
backend, as the OOM killer or a lost host would do it), :meth:`Cluster.restart` starts it again
on the same port and waits until crash recovery has finished and it accepts connections.

``fsync`` is off: a killed process loses nothing the kernel already holds, so crash recovery is
exercised exactly as on a real server while the tests stay fast. Only a machine crash would need
the fsyncs.

PostgreSQL refuses to run as root; under root the server runs as the unprivileged ``pgserver``
system user, the same one the ``pgserver`` package creates for itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bridge import embedded

SYSTEM_USER = "pgserver"
SUPERUSER = "postgres"
START_SECONDS = 60.0
STOP_SECONDS = 15.0
#: Small: tests open a handful of connections.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "shared_buffers": "16MB",
    "max_connections": "50",
    "logging_collector": "off",
}


class ClusterError(RuntimeError):
    """The throwaway server did not start or stop as asked; the message carries its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """One PostgreSQL data directory and, while it runs, its postmaster."""

    def __init__(
        self, base: Path, *, host: str = "127.0.0.1", settings: dict[str, str] | None = None
    ) -> None:
        self.base = base
        #: the server's settings, given on its command line (``-c``) at every start
        self.settings = {**SETTINGS, **(settings or {})}
        self.host = host
        self.port = free_port(host)
        self.data = base / "data"
        self.sockets = base / "sockets"
        self.log = base / "postgres.log"
        self._bin = embedded.binaries()
        self._as_user = _unprivileged_user(self._bin)
        self._setpriv = shutil.which("setpriv")
        self._postmaster: subprocess.Popen[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        """initdb with trust authentication for the superuser ``postgres``."""
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_user is not None:
            uid, gid = self._as_user
            for path in (self.base, self.sockets):
                os.chown(path, uid, gid)
        with self.log.open("ab") as log:
            subprocess.run(
                self._command(
                    [
                        str(self._bin / "initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        SUPERUSER,
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--locale=C",
                        "--no-sync",
                        "--no-instructions",
                    ]
                ),
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_SECONDS * 2,
                **self._user_kwargs(),
            )

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections (after any recovery)."""
        if self.running:
            return
        with self.log.open("ab") as log:
            self._postmaster = subprocess.Popen(
                self._command(
                    [
                        str(self._bin / "postgres"),
                        "-D",
                        str(self.data),
                        "-p",
                        str(self.port),
                        "-k",
                        str(self.sockets),
                        *(
                            arg
                            for name, value in self.settings.items()
                            for arg in ("-c", f"{name}={value}")
                        ),
                    ]
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C aimed at the test run does not reach the server, the
                # teardown stops it.
                start_new_session=True,
                **self._user_kwargs(),
            )
        self._wait_until_ready()

    def kill(self) -> None:
        """Crash the server: SIGKILL the postmaster and every backend, then reap them.

        The postmaster is frozen first, so it can neither fork a new backend nor react while
        its children die; then everything gets SIGKILL at once, backends before the postmaster
        (nobody says goodbye to a client). Returns when no process of the server is left, so
        a restart finds the port and the shared memory free.
        """
        postmaster = self._postmaster
        if postmaster is None:
            return
        self._postmaster = None
        victims: list[psutil.Process] = []
        with suppress(psutil.NoSuchProcess):
            root = psutil.Process(postmaster.pid)
            root.suspend()
            victims = [*root.children(recursive=True), root]
        for proc in victims:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        postmaster.wait(STOP_SECONDS)
        _wait_gone(victims)

    def restart(self) -> None:
        """Start again after a crash (or a stop), on the same port."""
        self.start()

    def stop(self) -> None:
        """Fast shutdown (SIGINT); a server that does not stop in time is killed."""
        postmaster = self._postmaster
        if postmaster is None:
            return
        with suppress(ProcessLookupError):
            postmaster.send_signal(signal.SIGINT)
        try:
            postmaster.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self._postmaster = None

    def destroy(self) -> None:
        """Stop the server and remove every file it had."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- facts -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._postmaster is not None and self._postmaster.poll() is None

    @property
    def pid(self) -> int:
        """The postmaster's process id."""
        if self._postmaster is None:
            raise ClusterError("the server is not running")
        return self._postmaster.pid

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{dbname}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------------

    def _command(self, args: list[str]) -> list[str]:
        """``args``, run as the unprivileged user when the tests run as root.

        The switch is made by ``setpriv`` after exec rather than by Popen's ``user=``: that
        forces a plain fork() of the test process, which runs the fork handlers of libraries
        already loaded (gRPC's event engine breaks in the child), while a spawn without it
        uses vfork and runs none.
        """
        if self._as_user is None or self._setpriv is None:
            return args
        uid, gid = self._as_user
        return [self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *args]

    def _user_kwargs(self) -> dict[str, Any]:
        if self._as_user is None or self._setpriv is not None:
            return {}
        uid, gid = self._as_user
        return {"user": uid, "group": gid, "extra_groups": []}

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._postmaster is not None
            if self._postmaster.poll() is not None:
                self._postmaster = None
                raise ClusterError(f"postgres exited while starting:\n{self.log_tail()}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:  # starting up, in recovery, not listening
                last = exc
                time.sleep(0.05)
        self.kill()
        raise ClusterError(f"postgres did not accept connections ({last}):\n{self.log_tail()}")


def _unprivileged_user(binaries: Path) -> tuple[int, int] | None:
    """Under root: the ``pgserver`` user's ids, with the binaries readable and executable."""
    if os.geteuid() != 0:
        return None
    import stat  # noqa: PLC0415

    from pgserver.utils import (  # noqa: PLC0415  (optional extra, root only)
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    entry = ensure_user_exists(SYSTEM_USER)
    assert entry is not None
    read = stat.S_IRGRP | stat.S_IROTH
    execute = stat.S_IXGRP | stat.S_IXOTH
    ensure_prefix_permissions(binaries)
    ensure_folder_permissions(binaries, read | execute)
    ensure_folder_permissions(binaries.parent / "lib", read)
    ensure_folder_permissions(binaries.parent / "share", read)
    return entry.pw_uid, entry.pw_gid


def _wait_gone(procs: list[psutil.Process]) -> None:
    """Wait until every process has exited; a zombie counts as gone (it holds no resources)."""
    deadline = time.monotonic() + STOP_SECONDS
    for proc in procs:
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
        else:
            raise ClusterError(f"server process {proc.pid} survived SIGKILL")


@contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """A started cluster for the ``with`` block, destroyed afterwards whatever happened."""
    base = Path(tempfile.mkdtemp(prefix="fbc-"))
    cluster: Cluster | None = None
    try:
        cluster = Cluster(base)
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)
