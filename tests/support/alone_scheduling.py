"""How ``-n N --dist loadfile`` hands out the suite: whole files, and the alone files together.

A test marked ``alone`` drives bridge processes at volume for minutes and waits for any other
such test to end first (``tests/conftest.py``). Handed out file by file, two of them can land on
two processes at once, and one process then sits idle on the lock for minutes. Here the files
holding them form one unit, run by one process one test after another, while the other
processes take the remaining files.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

#: the files holding tests marked ``alone``; collection fails if a marked test is elsewhere
ALONE_FILES = frozenset(
    {
        "tests/acceptance/test_pubsub_bridge.py",
        "tests/acceptance/test_sqs_held.py",
        "tests/acceptance/test_sqs_quota.py",
    }
)
ALONE_UNIT = "alone"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class AloneTogether(LoadFileScheduling):
    """Load-file scheduling where the alone files are one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        path = file_of(nodeid)
        return ALONE_UNIT if path in ALONE_FILES else path
