"""The cyclic garbage collector's settings for a bridge's own process (``fencebridge run``).

Every delivery allocates a few dozen objects (its decoded form, its claim, its run's context
and bookkeeping), and every one of them is freed by reference counting as soon as its run ends:
none is left in a reference cycle (``tests/integration/test_worker_pool.py`` holds the pool to
that). CPython's collector does not know this: with its default threshold it ran a
young-generation pass about every forty deliveries, and its full passes, which walk every
object the process holds (the configuration, the modules, the connection pool), held the
interpreter lock for tens of milliseconds: together about a tenth of the bridge's CPU per
delivery (docs/benchmarks.md, "Inbox to settle, end to end").

So the process freezes what its start made (it lives as long as the process: the collector
never looks at it again) and collects the young generation after 10,000 net allocations, not
700. Cyclic garbage is still collected, less often: a bounded amount, never a leak. A library
user's own process is left as it is: only ``fencebridge run`` calls :func:`settle_in`.
"""

from __future__ import annotations

import gc
from typing import Final

#: net allocations of tracked objects between two young-generation passes (CPython: 700)
YOUNG_THRESHOLD: Final = 10_000


def settle_in() -> None:
    """Once the process has started: collect what starting left behind, freeze the rest,
    raise the young generation's threshold (the older generations' are kept)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
