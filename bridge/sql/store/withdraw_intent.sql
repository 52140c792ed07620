-- A class D claim whose intent no standby confirmed in time gives the row back before the call,
-- which it has not made (wait_for_standby, bridge/store/replication.py): its own intent taken
-- back, the row queued and due now, the attempt not counted (as release.sql does for a claim
-- whose handler never started). Only while this claim holds the row and the intent is its own.
UPDATE work_item
   SET state = 'queued',
       intent_fence = NULL,
       attempts = attempts - 1,
       next_attempt_at = now(),
       lease_expires_at = NULL,
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
   AND intent_fence = %(fence)s
RETURNING fence
