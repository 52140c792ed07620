-- The demo's class B target: the balance an operation sets on an account, with the last fence
-- that wrote it. A fence orders the claims of one operation, so the record it guards belongs to
-- one operation (tenant_id, operation_id); writes set state and never add to it. `writes` counts
-- the writes the condition accepted: evidence for the tests and the demo, nothing reads it.
CREATE TABLE IF NOT EXISTS demo_balance (
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    account_id   text        NOT NULL,
    balance      bigint      NOT NULL,
    currency     text        NOT NULL,
    last_fence   bigint      NOT NULL,
    writes       integer     NOT NULL DEFAULT 1,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, operation_id)
)
