"""Run a command with an init of its own: every process orphaned below it is adopted and reaped.

Patroni starts PostgreSQL detached (a double fork into a new session), as a service manager
expects: on a host, systemd adopts the postmaster and reaps it when it dies. Started from a
test, the postmaster's parent would be the machine's PID 1, which in a container or a small VM
may reap nothing: a postmaster the test kills stays a zombie, and Patroni, which asks whether
its pid still exists, takes it for running and never fails over. Under this script (a child
subreaper, ``PR_SET_CHILD_SUBREAPER``) the orphans are adopted here and reaped at once, as on
a host; and every process the command started stays below this one, where a teardown finds it.

Usage: ``python subreaper.py COMMAND [ARG...]``. SIGTERM, SIGINT and SIGHUP go to the command;
the script exits with the command's status once no process is left below it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")
    child = os.posix_spawnp(argv[0], argv, os.environ)
    running = True

    def forward(signum: int, _frame: FrameType | None) -> None:
        if running:
            os.kill(child, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    status = 1
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:  # nothing left below this process
            return status
        if pid == child:
            running = False
            exit_code = os.waitstatus_to_exitcode(code)
            status = exit_code if exit_code >= 0 else 128 - exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
