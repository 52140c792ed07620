-- Count replays on their work rows (migration 0030): each key with the copies of it a batch
-- held beyond the first. The rows are locked in key order first, so two batches replaying the
-- same keys cannot deadlock; the fence, state and lease are not touched.
WITH copies AS (
    SELECT tenant_id, operation_id, n
      FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[], %(n)s::int[])
           AS r(tenant_id, operation_id, n)
),
locked AS (
    SELECT w.tenant_id, w.operation_id, c.n
      FROM work_item w
      JOIN copies c USING (tenant_id, operation_id)
     ORDER BY w.tenant_id, w.operation_id
       FOR NO KEY UPDATE OF w
)
UPDATE work_item w
   SET replays = w.replays + l.n,
       last_replay_at = coalesce(%(now)s::timestamptz, now())
  FROM locked l
 WHERE w.tenant_id = l.tenant_id
   AND w.operation_id = l.operation_id
