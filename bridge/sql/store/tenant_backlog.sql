-- The open backlog (queued and claimed rows, of every subscription) of each tenant of a batch,
-- counted up to %(cap)s rows each: past the quota the exact number does not matter, so a
-- flooding tenant costs at most %(cap)s index entries per batch. Queued rows are counted on
-- work_item_tenant_due, claimed ones (the rows with a lease, and so a claim time) on
-- work_item_tenant_leased (migration 0020); terminal and parked rows are never visited.
SELECT t.tenant_id,
       (SELECT count(*)
          FROM (SELECT 1
                  FROM work_item w
                 WHERE w.tenant_id = t.tenant_id
                   AND w.state = 'queued'
                 LIMIT %(cap)s) AS queued)
     + (SELECT count(*)
          FROM (SELECT 1
                  FROM work_item w
                 WHERE w.tenant_id = t.tenant_id
                   AND w.lease_expires_at IS NOT NULL
                   AND w.claimed_at IS NOT NULL
                 LIMIT %(cap)s) AS claimed) AS backlog
  FROM unnest(%(tenant_id)s::text[]) AS t(tenant_id)
