-- The open backlog (queued and claimed rows, of every subscription) of each tenant of a batch,
-- counted up to %(cap)s rows: past the quota the exact number does not matter, so a flooding
-- tenant costs at most %(cap)s index entries per batch. work_item_tenant_open (migration 0010)
-- holds exactly these rows; terminal and parked rows are never visited.
SELECT t.tenant_id,
       (SELECT count(*)
          FROM (SELECT 1
                  FROM work_item w
                 WHERE w.tenant_id = t.tenant_id
                   AND w.state IN ('queued', 'claimed')
                 LIMIT %(cap)s) AS open_rows) AS backlog
  FROM unnest(%(tenant_id)s::text[]) AS t(tenant_id)
