-- The attempt confirmed that nothing was applied and a later attempt may succeed: back to the
-- queue after the backoff, or failed_terminal when no attempt is left (bounded, never a loop).
-- The same statement ends this claim's attempt record with the state the row took.
WITH moved AS (
    UPDATE work_item
       SET state = CASE WHEN attempts >= max_attempts THEN 'failed_terminal' ELSE 'queued' END,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()) + %(backoff)s::interval,
           outcome_code = CASE WHEN attempts >= max_attempts THEN 'attempts_exhausted'
                               ELSE %(outcome_code)s END,
           outcome_detail = %(outcome_detail)s,
           lease_owner = NULL,
           lease_expires_at = NULL,
           settled_at = CASE WHEN attempts >= max_attempts
                             THEN coalesce(%(now)s::timestamptz, now()) END,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, fence, state, outcome_code, updated_at
),
ended AS (
    UPDATE work_attempt a
       SET ended_at = m.updated_at,
           outcome = m.state,
           outcome_code = m.outcome_code,
           error_class = %(error_class)s,
           finding = %(finding)s
      FROM moved m
     WHERE a.tenant_id = m.tenant_id
       AND a.operation_id = m.operation_id
       AND a.kind = 'claim'
       AND a.fence = m.fence
       AND a.ended_at IS NULL
)
SELECT state FROM moved
