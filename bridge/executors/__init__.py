"""Fenced executors, one module per target class; :func:`execute` picks by the handler's base.

=====  =====================================  ==========================================
class  module                                 what it can honestly claim
=====  =====================================  ==========================================
A      :mod:`~bridge.executors.same_database`  a stale worker cannot commit its write
B      :mod:`~bridge.executors.conditional_write`  the target rejects lower fences
C      :mod:`~bridge.executors.idempotent_api`  provider dedupe + reconcile (not fencing)
D      :mod:`~bridge.executors.unfenced`       at most one call; ambiguity → unknown
=====  =====================================  ==========================================
"""

from __future__ import annotations

from bridge.executors import conditional_write, idempotent_api, same_database, unfenced
from bridge.executors.settlement import Run
from bridge.handlers import (
    ConditionalWriteHandler,
    IdempotentApiHandler,
    SameDatabaseHandler,
    UnfencedHandler,
)

__all__ = ["Run", "execute"]


def execute(run: Run) -> None:
    """Run one claim to exactly one fenced settlement (or a reported loss of ownership)."""
    handler = run.spec.handler
    if isinstance(handler, SameDatabaseHandler):
        same_database.execute(run, handler)
    elif isinstance(handler, ConditionalWriteHandler):
        conditional_write.execute(run, handler)
    elif isinstance(handler, IdempotentApiHandler):
        idempotent_api.execute(run, handler)
    elif isinstance(handler, UnfencedHandler):
        unfenced.execute(run, handler)
    else:  # pragma: no cover - the registry accepts only the four bases
        raise TypeError(f"no executor for {type(handler).__name__}")
