"""Class B example: set an account balance in a PostgreSQL table that stores the last fence.

The target is a separate store as far as fencebridge is concerned (it may be another database;
in the demo it is a table beside the work table). Each write carries the claim's fence in its own
condition (``... WHERE demo_balance.last_fence <= %(fence)s``, see
:func:`bridge.targets.postgres.fenced_write`), so the table itself refuses a worker that was
paused past its lease and woke up after a newer claim wrote: that write raises
:class:`~bridge.errors.FencedOut` and changes nothing.

A fence orders the claims of *one* operation, so the guarded record belongs to one operation
(keyed by tenant and operation id). The write sets the balance, never adds to it: a newer claim
that repeats the write leaves the same state.

Payload (JSON)::

    {"account_id": "acc-7", "balance": 15000, "currency": "eur"}
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from bridge.database import Connection
from bridge.demo import statement
from bridge.handlers import ConditionalWriteHandler, Context, Quarantine, Success
from bridge.targets.postgres import fenced_write

JOB_TYPE = "set_balance"

#: Lends a connection to the target database for one write (``ConnectionPool.connection`` fits).
ConnectionSource = Callable[[], AbstractContextManager[Connection]]


@dataclass(frozen=True, slots=True)
class Balance:
    tenant_id: str
    operation_id: str
    account_id: str
    balance: int
    currency: str
    #: the fence of the last claim whose write the table accepted
    last_fence: int
    #: how many writes the condition accepted
    writes: int


@dataclass(frozen=True, slots=True)
class BalanceRequest:
    account_id: str
    balance: int
    currency: str

    @classmethod
    def of(cls, ctx: Context) -> BalanceRequest:
        """Read the payload, or quarantine it: a balance is never guessed."""
        data = ctx.json()
        if not isinstance(data, dict):
            raise Quarantine("invalid_payload", "the payload must be a JSON object")
        account_id, balance, currency = (data.get(k) for k in ("account_id", "balance", "currency"))
        if not isinstance(account_id, str) or not account_id:
            raise Quarantine("invalid_payload", "account_id must be a non-empty string")
        if not isinstance(balance, int) or isinstance(balance, bool):
            raise Quarantine("invalid_payload", "balance must be an integer (minor units)")
        if not isinstance(currency, str) or len(currency) != 3:
            raise Quarantine("invalid_payload", "currency must be a three-letter code")
        return cls(account_id, balance, currency.lower())


def install(conn: Connection) -> None:
    """Create the demo's balance table (idempotent)."""
    conn.execute(statement("balance_schema"))


def find_balance(conn: Connection, tenant_id: str, operation_id: str) -> Balance | None:
    row = conn.execute(
        statement("balance_read"), {"tenant_id": tenant_id, "operation_id": operation_id}
    ).fetchone()
    return Balance(*row) if row is not None else None


class SetBalance(ConditionalWriteHandler):
    """Set the balance with the claim's fence in the write's own condition."""

    def __init__(self, connection: ConnectionSource) -> None:
        self._connection = connection

    def handle(self, ctx: Context) -> Success:
        request = BalanceRequest.of(ctx)
        ctx.progress()  # the write below is the step; a lost lease stops us before it
        with self._connection() as conn:
            fenced_write(
                conn,
                statement("balance_write"),
                {
                    "tenant_id": ctx.tenant_id,
                    "operation_id": ctx.operation_id,
                    "account_id": request.account_id,
                    "balance": request.balance,
                    "currency": request.currency,
                },
                ctx,
            )
        return Success("balance_set")
