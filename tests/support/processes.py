"""The part every subprocess a test drives shares: a crash on demand, and no process left behind."""

from __future__ import annotations

import signal
import subprocess
from types import TracebackType
from typing import Any, Self

#: how long a killed process may take to be reaped
REAP_SECONDS = 60.0


class ChildProcess:
    """A started process; a subclass sets ``_proc`` and releases its own files in ``_release``."""

    _proc: subprocess.Popen[Any]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill the process if it still runs (a test that failed half-way), then release."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._release()

    def _release(self) -> None:
        """Close what the subclass opened for the process (its log, its pipes)."""

    def kill(self) -> None:
        """SIGKILL: a crash, nothing runs after it."""
        self._proc.kill()
        assert self._proc.wait(timeout=REAP_SECONDS) == -signal.SIGKILL
