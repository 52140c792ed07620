-- The target refused the call for now (429, quota) before acting: back to the queue after the
-- target's wait with the attempt given back (a limit is not the operation's failure, so it
-- never uses up max_attempts), under the fence like every settlement. The row's (job_type,
-- tenant_id) waits as long: claim and claim_keys skip the key until then. The same statement
-- records this claim's attempt as queued (as settle_many.sql records one), keeps the later of
-- an existing and the new wait, and deletes the tenant's other waits that have passed (the
-- table is cleaned here, lazily).
WITH moved AS (
    UPDATE work_item
       SET state = 'queued',
           attempts = attempts - 1,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()) + %(retry_after)s::interval,
           claim_order = coalesce(%(now)s::timestamptz, now()) + %(retry_after)s::interval
                          - make_interval(secs => priority * %(aging)s::float8),
           outcome_code = %(outcome_code)s,
           outcome_detail = %(outcome_detail)s,
           lease_expires_at = NULL,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, job_type, fence, state, outcome_code, next_attempt_at,
              lease_owner, claimed_at, updated_at
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
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT m.tenant_id, m.operation_id, 'claim', m.fence, m.lease_owner,
           m.claimed_at, m.updated_at, m.state, m.outcome_code, %(error_class)s, %(finding)s
      FROM moved m
     WHERE %(history)s::integer > 0
),
trimmed AS (
    DELETE FROM work_attempt a
     USING moved m
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM moved y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * m.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = m.tenant_id
       AND a.operation_id = m.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = m.tenant_id
                       AND b.operation_id = m.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT state FROM moved
