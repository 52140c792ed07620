"""How ``-n N --dist loadfile`` hands out the suite: whole files, and the alone files together.

A test marked ``alone`` drives bridge processes at volume for minutes and waits for any other
such test to end first (``tests/conftest.py``). Handed out file by file, two of them can land on
two processes at once, and one process then sits idle on the lock for minutes. Here the files
holding them form one unit, run by one process one test after another, while the other
processes take the remaining files.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

#: the files holding tests marked ``alone``; collection fails if a marked test is elsewhere
ALONE_FILES = frozenset(
    {
        "tests/acceptance/test_database_partition.py",
        "tests/acceptance/test_failover.py",
        "tests/acceptance/test_patroni_failover.py",
        "tests/acceptance/test_pubsub_bridge.py",
        "tests/acceptance/test_pubsub_key_order.py",
        "tests/acceptance/test_pubsub_ordered.py",
        "tests/acceptance/test_skewed_clock.py",
        "tests/acceptance/test_sqs_held.py",
        "tests/acceptance/test_sqs_quota.py",
    }
)
ALONE_UNIT = "alone"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class AloneTogether(LoadFileScheduling):
    """Load-file scheduling where the alone files are one unit of work, handed out first.

    It is the longest unit (minutes per test, one after another): started last, as xdist's
    order by number of tests would have it, the run ends on it while the other process idles.
    """

    def _assign_work_unit(self, node: Any) -> None:
        if ALONE_UNIT in self.workqueue:
            self.workqueue.move_to_end(ALONE_UNIT, last=False)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        path = file_of(nodeid)
        return ALONE_UNIT if path in ALONE_FILES else path
