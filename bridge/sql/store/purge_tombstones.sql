-- One bounded batch of tombstones (migration 0014) erased before the horizon, oldest first: past
-- it no broker can hand the erased operation over again, so nothing is left to recognise.
WITH old AS (
    SELECT e.key_id, e.operation_hash
      FROM erased_operation e
     WHERE e.erased_at < coalesce(%(now)s::timestamptz, now()) - %(horizon)s::interval
     ORDER BY e.erased_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM erased_operation e
     USING old o
     WHERE e.key_id = o.key_id
       AND e.operation_hash = o.operation_hash
    RETURNING 1
)
SELECT count(*) FROM gone
