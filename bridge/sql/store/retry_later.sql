-- The attempt confirmed that nothing was applied and a later attempt may succeed: back to the
-- queue after the backoff, or failed_terminal when no attempt is left (bounded, never a loop).
UPDATE work_item
   SET state = CASE WHEN attempts >= max_attempts THEN 'failed_terminal' ELSE 'queued' END,
       next_attempt_at = coalesce(%(now)s::timestamptz, now()) + %(backoff)s::interval,
       outcome_code = CASE WHEN attempts >= max_attempts THEN 'attempts_exhausted'
                           ELSE %(outcome_code)s END,
       outcome_detail = %(outcome_detail)s,
       lease_owner = NULL,
       lease_expires_at = NULL,
       settled_at = CASE WHEN attempts >= max_attempts THEN coalesce(%(now)s::timestamptz, now()) END,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
RETURNING state
