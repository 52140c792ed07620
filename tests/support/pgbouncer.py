"""A PgBouncer (Debian's ``pgbouncer``) in front of a PostgreSQL server, for the pooler tests.

It listens on a free port on 127.0.0.1 and sends every database to the server of ``target``
with trust authentication, in the pool mode asked for. PgBouncer refuses to run as root; under
root it drops to the server's ``postgres`` user (``-u``). Stopped and its files removed after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import conninfo

from tests.support.bridge_process import free_port

START_SECONDS = 30.0


@contextmanager
def pgbouncer(
    target: str, *, pool_mode: str = "transaction", ignore_startup_parameters: str = ""
) -> Iterator[str]:
    """A started PgBouncer in front of ``target``'s server; yields the URL of ``target``'s
    database through it."""
    program = shutil.which("pgbouncer")
    assert program is not None, "install Debian's pgbouncer"
    params = conninfo.conninfo_to_dict(target)
    base = Path(tempfile.mkdtemp(prefix="fbpgb-"))
    os.chmod(base, 0o777)
    port = free_port()
    (base / "users.txt").write_text(f'"{params.get("user", "postgres")}" ""\n')
    (base / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={params.get("host") or "127.0.0.1"} port={params.get("port") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {base / "users.txt"}
pool_mode = {pool_mode}
ignore_startup_parameters = {ignore_startup_parameters}
max_client_conn = 200
default_pool_size = 20
logfile = {base / "pgbouncer.log"}
pidfile = {base / "pgbouncer.pid"}
"""
    )
    for path in base.iterdir():
        os.chmod(path, 0o666)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    proc = subprocess.Popen(
        [program, *user, str(base / "pgbouncer.ini")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = conninfo.make_conninfo(target, host="127.0.0.1", port=str(port))
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = base / "pgbouncer.log"
                    raise AssertionError(
                        f"pgbouncer did not start: {log.read_text() if log.exists() else ''}"
                    ) from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)
