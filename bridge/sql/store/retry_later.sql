-- The attempt confirmed that nothing was applied and a later attempt may succeed: back to the
-- queue after the backoff, or failed_terminal when no attempt is left (bounded, never a loop).
-- The same statement records this claim's attempt with the state the row took (as
-- settle_many.sql records one).
WITH moved AS (
    UPDATE work_item
       SET state = CASE WHEN attempts >= max_attempts THEN 'failed_terminal' ELSE 'queued' END,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()) + %(backoff)s::interval,
           claim_order = coalesce(%(now)s::timestamptz, now()) + %(backoff)s::interval
                          - make_interval(secs => priority * %(aging)s::float8),
           outcome_code = CASE WHEN attempts >= max_attempts THEN 'attempts_exhausted'
                               ELSE %(outcome_code)s END,
           outcome_detail = %(outcome_detail)s,
           lease_expires_at = NULL,
           settled_at = CASE WHEN attempts >= max_attempts
                             THEN coalesce(%(now)s::timestamptz, now()) END,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, fence, state, outcome_code, lease_owner, claimed_at,
              updated_at
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
