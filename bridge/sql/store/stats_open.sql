-- Row counts by subscription, tenant and state of the open rows (queued, claimed) and the
-- parked ones (unknown, quarantined): what the database gauges read every refresh, in every
-- replica (fencebridge.queue.depth, fencebridge.quarantined). Each part names its state as the
-- predicate of a partial index states it, so it reads that index's rows and no others: queued
-- rows from work_item_due or work_item_tenant_due, claimed ones (exactly the rows with a lease,
-- work_item's CHECK) from work_item_lease, parked ones from work_item_parked. Its cost follows the
-- backlog, not the history: succeeded and failed rows are never read. stats_counts.sql counts
-- every state for `fencebridge status`, on the operator's command.
SELECT subscription, tenant_id, state, count(*) AS n
  FROM work_item
 WHERE state = 'queued'
 GROUP BY subscription, tenant_id, state
UNION ALL
SELECT subscription, tenant_id, state, count(*)
  FROM work_item
 WHERE state = 'claimed'
   AND lease_expires_at IS NOT NULL
 GROUP BY subscription, tenant_id, state
UNION ALL
SELECT subscription, tenant_id, state, count(*)
  FROM work_item
 WHERE state IN ('unknown', 'quarantined')
 GROUP BY subscription, tenant_id, state
 ORDER BY 1, 2, 3
