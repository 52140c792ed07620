-- fencebridge: no transaction
-- Built CONCURRENTLY, so the bridge keeps writing to work_item while it is built; the runner
-- applies it statement by statement and rebuilds an index an interrupted build left invalid.

-- The tenant backlog quota ([bridge] tenant_backlog_quota) counts a tenant's open rows before
-- each inbox batch (tenant_backlog.sql). The primary key would find the tenant's rows but visit
-- its terminal ones too, millions for an old tenant; this index holds only queued and claimed
-- rows, so the count stops after the quota's number of entries. A row enters it when written
-- and leaves it when settled; a claim (queued -> claimed) rewrites its entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_tenant_open ON work_item (tenant_id)
    WHERE state IN ('queued', 'claimed');
