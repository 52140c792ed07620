"""fencebridge: broker deliveries become fenced work rows in PostgreSQL.

This is what a team imports to write its handlers (``from bridge import ...``): a base class
per target class, the context a run gets, the outcomes a handler may end in, and the errors it
may meet. ``docs/target-classes.md`` walks through each class with an example.

=====  ================================  ==================================================
class  base class                        what the team implements
=====  ================================  ==================================================
A      :class:`SameDatabaseHandler`      ``handle(ctx, tx)``: the business write on ``tx``
B      :class:`ConditionalWriteHandler`  ``handle(ctx)``: writes that carry ``ctx.fence``
C      :class:`IdempotentApiHandler`     ``perform(ctx, key)`` and ``lookup(ctx, key)``
D      :class:`UnfencedHandler`          ``call(ctx)``: at most one call, ever
=====  ================================  ==================================================

The rest of the package is the bridge's own rooms: ``runtime/`` (the running process),
``ingest/`` (deliveries to work rows), ``executors/`` and ``targets/`` (fenced execution),
``store/`` (the database), ``adapters/`` (the kit a broker adapter imports), ``outbox/``,
``operator/`` with its faces ``commands/`` and ``console/``, and ``config/``, ``telemetry/``.
"""

from bridge.errors import FencedOut, LeaseLost
from bridge.handlers import (
    Ambiguous,
    Applied,
    CannotTell,
    ConditionalWriteHandler,
    Context,
    Handler,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    RateLimited,
    RetryLater,
    RetryPolicy,
    SameDatabaseHandler,
    Success,
    TerminalFailure,
    UnfencedHandler,
)
from bridge.outbox.publish import OutboxError
from bridge.types import Key, TargetClass

__all__ = [
    "Ambiguous",
    "Applied",
    "CannotTell",
    "ConditionalWriteHandler",
    "Context",
    "FencedOut",
    "Handler",
    "IdempotentApiHandler",
    "Key",
    "LeaseLost",
    "NotApplied",
    "OutboxError",
    "Quarantine",
    "RateLimited",
    "RetryLater",
    "RetryPolicy",
    "SameDatabaseHandler",
    "Success",
    "TargetClass",
    "TerminalFailure",
    "UnfencedHandler",
]
