"""Refuse at start a database connection that does not keep the bridge's session settings.

Every connection of the bridge starts with its limits as startup ``options``
(``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``; see
:func:`bridge.database.open_pool`), keeps prepared statements, takes advisory locks and, for a
claimer, keeps one server session across calls. A connection pooler that hands each transaction
to whichever server session is free (PgBouncer's ``pool_mode = transaction`` or ``statement``)
keeps none of that, and PgBouncer in any mode refuses the ``options`` startup parameter (or, with
``ignore_startup_parameters = options``, drops it silently: no statement would be bounded).
Rather than run unbounded or fail at random later, ``fencebridge run`` checks one connection
before it starts: the server must have applied every limit the bridge asked for.
"""

from __future__ import annotations

from datetime import timedelta

from bridge import sql
from bridge.database import SessionTimeouts, connect, milliseconds
from bridge.errors import ConfigError, StoreUnavailable

POOLER = (
    "connect the bridge to PostgreSQL directly, not through a pooler in transaction or "
    "statement mode or one that drops startup options (PgBouncer); see operations.md, "
    "'Behind a connection pooler'"
)


def require_session(url: str, timeouts: SessionTimeouts) -> None:
    """Raise :class:`ConfigError` naming the reason when a connection does not start with
    ``timeouts`` applied."""
    try:
        conn = connect(url, timeouts=timeouts)
    except StoreUnavailable as exc:
        if "unsupported startup parameter" in str(exc):
            raise ConfigError(
                f"the database refused the bridge's session settings ({exc}): {POOLER}"
            ) from None
        raise
    with conn:
        row = conn.execute(sql.statement("session_settings")).fetchone()
    assert row is not None
    wanted = (timeouts.statement, timeouts.lock, timeouts.idle_in_transaction)
    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    for name, want, have in zip(names, wanted, row, strict=True):
        if want is not None and want > timedelta(0) and int(have) != milliseconds(want):
            raise ConfigError(
                f"the session did not start with the bridge's {name} ({milliseconds(want)} ms "
                f"asked, {have} ms applied): its startup options were dropped; {POOLER}"
            )
