"""Waiting for something another thread or process makes true, with a deadline, never a sleep."""

from __future__ import annotations

import time
from collections.abc import Callable

#: generous: a wait that reaches it means something hung; passing runs never get near it
DEADLINE = 90.0
POLL = 0.05


def eventually(
    check: Callable[[], bool], what: str, timeout: float = DEADLINE, poll: float = POLL
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out after {timeout:.0f}s waiting for: {what}"
        time.sleep(poll)
