-- Before a call to a target that can be neither fenced nor asked afterwards (class D): record
-- that this fence is about to call it. Any later claim that sees the intent parks the row as
-- unknown instead of calling again.
UPDATE work_item
   SET intent_fence = fence,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
RETURNING intent_fence
