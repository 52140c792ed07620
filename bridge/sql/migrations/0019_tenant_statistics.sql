-- How many tenants the planner assumes work_item holds, whatever its last ANALYZE sampled.
--
-- A tenant-fair claim (claim_fair.sql) reads each tenant's due rows from work_item_tenant_due
-- with the tenant taken from its walk, a value the plan cannot know. When ANALYZE last saw one
-- tenant, or one tenant's flood, the planner takes any tenant to match every queued row, finds
-- work_item_due (claim order alone) as cheap, and reads a quiet tenant's one row by filtering
-- the whole flood: measured on a 50,000-row flood beside one quiet row, 24 ms of server time
-- per claim instead of 1.9 ms, and the pool's claims fell to about 120 rows a second while the
-- quiet tenant wrote. A distinct tenant per thousand rows is what a tenant filter is planned for
-- from now on: its rows are read from the indexes that lead with the tenant. Applied at the
-- next ANALYZE (autovacuum's, or the one below). Takes a SHARE UPDATE EXCLUSIVE lock: reads and
-- writes of the table go on.
ALTER TABLE work_item ALTER COLUMN tenant_id SET (n_distinct = -0.001);
ANALYZE work_item;
