-- Give back a claim whose handler never started (the worker is stopping): the row returns to
-- the queue due now and the attempt is not counted, because nothing was attempted. Fenced like
-- every other write; the same statement ends the claim's attempt record as released.
WITH released AS (
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
    RETURNING tenant_id, operation_id, fence, state, updated_at
),
ended AS (
    UPDATE work_attempt a
       SET ended_at = r.updated_at,
           outcome = 'released',
           outcome_code = 'released'
      FROM released r
     WHERE a.tenant_id = r.tenant_id
       AND a.operation_id = r.operation_id
       AND a.kind = 'claim'
       AND a.fence = r.fence
       AND a.ended_at IS NULL
)
SELECT state FROM released
