"""Class A example: refund an invoice that lives in the same database as the work table.

The executor opens one transaction, locks the work row under the claim's fence and hands this
handler the transaction's connection; the refund and the completion of the work row commit
together or not at all. A worker whose claim is gone is stopped at the lock, before it writes.

The refund also carries its own guard (``... AND status = 'paid'``): defence in depth, so even a
bug in fencing could not refund an invoice twice. When the guard matches nothing the invoice is
either refunded already by *this* operation (a success: the effect is there) or not refundable,
which retrying cannot change.

:class:`RefundAndAnnounce` also publishes a "refund issued" event through the transactional
outbox (``ctx.outbox``): the event is a row written in the same transaction, so it exists if and
only if the refund committed, and the relay sends it afterwards (``[outbox.invoice_events]``).

Payload (JSON)::

    {"invoice_id": "inv-1042"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bridge.database import Connection
from bridge.demo import statement
from bridge.handlers import Context, Quarantine, SameDatabaseHandler, Success, TerminalFailure

JOB_TYPE = "refund_invoice"
#: the outbox destination :class:`RefundAndAnnounce` publishes its events to
EVENTS = "invoice_events"


@dataclass(frozen=True, slots=True)
class Invoice:
    tenant_id: str
    invoice_id: str
    amount: int
    currency: str
    status: str
    #: the fence of the claim whose transaction refunded it
    refunded_fence: int | None
    refund_operation_id: str | None


def install(conn: Connection) -> None:
    """Create the demo's invoice table (idempotent)."""
    conn.execute(statement("invoice_schema"))


def add_invoice(
    conn: Connection,
    tenant_id: str,
    invoice_id: str,
    *,
    amount: int,
    currency: str = "eur",
    status: str = "paid",
) -> None:
    conn.execute(
        statement("invoice_insert"),
        {
            "tenant_id": tenant_id,
            "invoice_id": invoice_id,
            "amount": amount,
            "currency": currency,
            "status": status,
        },
    )


def find_invoice(conn: Connection, tenant_id: str, invoice_id: str) -> Invoice | None:
    row = conn.execute(
        statement("invoice_read"), {"tenant_id": tenant_id, "invoice_id": invoice_id}
    ).fetchone()
    return Invoice(*row) if row is not None else None


def invoice_id_of(ctx: Context) -> str:
    """The invoice a refund request names; anything else in the payload is not guessed at."""
    request = ctx.json()
    invoice_id = request.get("invoice_id") if isinstance(request, dict) else None
    if not isinstance(invoice_id, str) or not invoice_id:
        raise Quarantine("invalid_payload", "invoice_id must be a non-empty string")
    return invoice_id


class RefundInvoice(SameDatabaseHandler):
    """Refund a paid invoice, in the transaction that holds the work row under its fence."""

    def handle(self, ctx: Context, tx: Connection) -> Success:
        invoice_id = invoice_id_of(ctx)
        key = {"tenant_id": ctx.tenant_id, "invoice_id": invoice_id}
        refunded = tx.execute(
            statement("invoice_refund"),
            {**key, "fence": ctx.fence, "operation_id": ctx.operation_id},
        ).fetchone()
        if refunded is not None:
            return Success("refunded")
        current = find_invoice(tx, ctx.tenant_id, invoice_id)
        if current is None:
            raise TerminalFailure("not_refundable", "no such invoice")
        if current.status == "refunded" and current.refund_operation_id == ctx.operation_id:
            return Success("already_refunded")
        raise TerminalFailure("not_refundable", f"the invoice is {current.status}")


class RefundAndAnnounce(RefundInvoice):
    """Refund the invoice and announce it, both in the fenced transaction.

    The event goes to the outbox destination :data:`EVENTS`, ordered by invoice: whoever consumes
    it sees an invoice's events in the order they were written, each with a stable message id
    (``fencebridge-message-id``) to deduplicate on. A worker whose claim is gone never commits,
    so its event never exists; a retry writes the same message id again.
    """

    def handle(self, ctx: Context, tx: Connection) -> Success:
        result = super().handle(ctx, tx)
        invoice = find_invoice(tx, ctx.tenant_id, invoice_id_of(ctx))
        assert invoice is not None  # refunded in this transaction, or by this operation
        event = {
            "event": "refund_issued",
            "invoice_id": invoice.invoice_id,
            "amount": invoice.amount,
            "currency": invoice.currency,
        }
        ctx.outbox.publish(
            EVENTS,
            json.dumps(event, sort_keys=True),
            attributes={"event": "refund_issued", "tenant_id": ctx.tenant_id},
            ordering_key=invoice.invoice_id,
        )
        return result
