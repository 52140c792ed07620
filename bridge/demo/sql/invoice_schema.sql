-- The demo's invoices: the business table a class A handler writes in the same database (and the
-- same transaction) as the work row. refunded_fence and refund_operation_id record which claim of
-- which operation refunded the invoice, so a reader can see there was exactly one.
CREATE TABLE IF NOT EXISTS demo_invoice (
    tenant_id           text        NOT NULL,
    invoice_id          text        NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL,
    status              text        NOT NULL CHECK (status IN ('draft', 'paid', 'refunded', 'void')),
    refunded_fence      bigint,
    refund_operation_id text,
    refunded_at         timestamptz,
    PRIMARY KEY (tenant_id, invoice_id),
    CHECK ((status = 'refunded') = (refunded_fence IS NOT NULL))
)
