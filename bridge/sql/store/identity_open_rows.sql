-- Open rows (those that may still run or be redriven, so may still need their key) per key id,
-- for the keys not in %(held)s. Read through the partial indexes of queued, claimed (the rows
-- with a lease: work_item_lease) and parked rows: the cost follows the work in flight, not the
-- table's history.
SELECT identity_key_id, count(*) AS n
  FROM (SELECT identity_key_id FROM work_item WHERE state = 'queued'
        UNION ALL
        SELECT identity_key_id FROM work_item WHERE lease_expires_at IS NOT NULL
        UNION ALL
        SELECT identity_key_id FROM work_item WHERE state IN ('unknown', 'quarantined')) AS open
 WHERE identity_key_id <> ALL (%(held)s::smallint[])
 GROUP BY identity_key_id
 ORDER BY identity_key_id
