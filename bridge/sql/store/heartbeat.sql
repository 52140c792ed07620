-- Extend the lease, only while this exact claim (fence) still holds the row.
UPDATE work_item
   SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
RETURNING lease_expires_at
