-- Batch heartbeat: extends each lease whose fence is still current; returns the keys extended
-- with their fence (a caller may hold a stale and a current ticket for the same row).
UPDATE work_item w
   SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
       updated_at = coalesce(%(now)s::timestamptz, now())
  FROM unnest(%(tenant_id)b::text[], %(operation_id)b::text[], %(fence)b::bigint[])
       AS t(tenant_id, operation_id, fence)
 WHERE w.tenant_id = t.tenant_id
   AND w.operation_id = t.operation_id
   AND w.fence = t.fence
   AND w.state = 'claimed'
RETURNING w.tenant_id, w.operation_id, w.fence
