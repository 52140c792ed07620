-- Record replays (migration 0030): one delivery_copy row per copy a batch held beyond the
-- first, appended; the work row is not written. Each replayed row is locked FOR KEY SHARE first,
-- in key order: a claim's or a settlement's update does not wait for that lock nor it for them,
-- and a row purged or erased since the batch looked it up is skipped (it has no evidence left to
-- keep) instead of failing the insert's foreign key.
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
       FOR KEY SHARE OF w
)
INSERT INTO delivery_copy (tenant_id, operation_id, arrived_at)
SELECT l.tenant_id, l.operation_id, coalesce(%(now)s::timestamptz, now())
  FROM locked l
 CROSS JOIN LATERAL generate_series(1, l.n)
