-- fencebridge: no transaction
-- Built and dropped CONCURRENTLY, so the bridge keeps writing to work_item meanwhile; the runner
-- applies them statement by statement and rebuilds an index an interrupted build left invalid.

-- Plans that stay bounded whatever ANALYZE last saw. The bridge's connections plan each
-- statement once (force_generic_plan), from the statistics of the moment. When ANALYZE last
-- ran on a drained table (every row terminal), the planner takes any partial index of open
-- rows for empty, hence cheapest: the fenced writes (tenant_id = .. AND operation_id = ..
-- AND state = 'claimed') read work_item_tenant_open or work_item_claimed, whose predicates
-- their state implies, and filtered every open row of the tenant (or every claimed row) to
-- find one; the claims read their due rows through work_item_tenant_open too and sorted the
-- whole backlog. Measured with 10,000 rows queued and 5,000 claimed after such an ANALYZE: a
-- claim of 10 rows took 10.9 ms instead of 1.1, a heartbeat 2.5 ms instead of 0.3, and each
-- grew with the backlog until the next ANALYZE. With the indexes below, the only index a
-- fenced write can use is the primary key, the claims read work_item_due or
-- work_item_tenant_due in their own order and stop at their limit, and the takeovers read
-- expired leases alone.

-- Expired leases in expiry order (the takeovers of claim_expired.sql, the sweep): a range of
-- this index, where work_item_claimed (claimed_at) made every claim visit every claimed row.
-- Its predicate is the lease, not the state: claimed rows are exactly the rows with a lease
-- (work_item's CHECK), but `state = 'claimed'` does not imply it for the planner, so the
-- fenced writes cannot take it for the row they name.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_lease ON work_item (lease_expires_at, seq)
    WHERE lease_expires_at IS NOT NULL;

-- A tenant's claimed rows, for the backlog quota (tenant_backlog.sql), which counts its queued
-- rows on work_item_tenant_due: together the open rows work_item_tenant_open held. The
-- predicate names claimed_at as well, which the quota's count states and the takeovers do not:
-- with the lease alone, the planner took this smaller index for the takeovers' and read every
-- claimed row in a claim again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_tenant_leased ON work_item (tenant_id)
    WHERE lease_expires_at IS NOT NULL AND claimed_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS work_item_claimed;
DROP INDEX CONCURRENTLY IF EXISTS work_item_tenant_open;
-- The due time alone (migration 0001): claims read queued rows in claim order since 0012,
-- from work_item_due; this one only cost every inbox write an index entry, and, planned from a
-- drained table's statistics, let a claim read the backlog by due time and sort it.
DROP INDEX CONCURRENTLY IF EXISTS work_item_queued;
