-- The target refused the call for now (429, quota) before acting: back to the queue after the
-- target's wait with the attempt given back (a limit is not the operation's failure, so it
-- never uses up max_attempts), under the fence like every settlement. The row's (job_type,
-- tenant_id) waits as long: claim and claim_keys skip the key until then. The same statement
-- ends this claim's attempt record as queued, keeps the later of an existing and the new wait,
-- and deletes the tenant's other waits that have passed (the table is cleaned here, lazily).
WITH moved AS (
    UPDATE work_item
       SET state = 'queued',
           attempts = attempts - 1,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()) + %(retry_after)s::interval,
           outcome_code = %(outcome_code)s,
           outcome_detail = %(outcome_detail)s,
           lease_owner = NULL,
           lease_expires_at = NULL,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, job_type, fence, state, outcome_code, next_attempt_at,
              updated_at
),
waiting AS (
    INSERT INTO rate_wait AS r (job_type, tenant_id, until)
    SELECT job_type, tenant_id, next_attempt_at FROM moved
        ON CONFLICT (job_type, tenant_id) DO UPDATE
       SET until = greatest(r.until, excluded.until)
),
passed AS (
    DELETE FROM rate_wait r
     USING moved m
     WHERE r.tenant_id = m.tenant_id
       AND r.job_type <> m.job_type
       AND r.until <= coalesce(%(now)s::timestamptz, now())
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
