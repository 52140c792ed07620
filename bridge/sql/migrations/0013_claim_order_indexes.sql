-- fencebridge: no transaction
-- Built CONCURRENTLY, so the bridge keeps writing to work_item while they are built; the runner
-- applies them statement by statement and rebuilds an index an interrupted build left invalid.

-- The claim order (migration 0012): claims read queued rows by (claim_order, seq), and stop at
-- their LIMIT. work_item_queued (next_attempt_at, seq) stays for the earlier release's claims
-- until a later release drops it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_due ON work_item (claim_order, seq)
    WHERE state = 'queued';

-- Tenant-fair claims (claim_fair.sql) walk the tenants that have queued rows, one descent of
-- this index per tenant, and read each tenant's rows in claim order from it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_tenant_due
    ON work_item (tenant_id, claim_order, seq)
    WHERE state = 'queued';
