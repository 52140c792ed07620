-- Give back a claim whose handler never started (the worker is stopping): the row returns to
-- the queue due now and the attempt is not counted, because nothing was attempted. Fenced like
-- every other write.
UPDATE work_item
   SET state = 'queued',
       attempts = attempts - 1,
       next_attempt_at = coalesce(%(now)s::timestamptz, now()),
       lease_owner = NULL,
       lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
   AND intent_fence IS DISTINCT FROM fence
RETURNING state
