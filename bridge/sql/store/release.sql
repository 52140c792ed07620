-- Give back a claim whose handler never started (the worker is stopping): the row returns to
-- the queue due now and the attempt is not counted, because nothing was attempted. Fenced like
-- every other write; the same statement records the claim's attempt as released (as
-- settle_many.sql records one).
WITH released AS (
    UPDATE work_item
       SET state = 'queued',
           attempts = attempts - 1,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()),
           claim_order = coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => priority * %(aging)s::float8),
           lease_expires_at = NULL,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
       AND intent_fence IS DISTINCT FROM fence
    RETURNING tenant_id, operation_id, fence, state, lease_owner, claimed_at, updated_at
),
ended AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT r.tenant_id, r.operation_id, 'claim', r.fence, r.lease_owner,
           r.claimed_at, r.updated_at, 'released', 'released', NULL, NULL
      FROM released r
     WHERE %(history)s::integer > 0
),
trimmed AS (
    DELETE FROM work_attempt a
     USING released r
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM released y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * r.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = r.tenant_id
       AND a.operation_id = r.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = r.tenant_id
                       AND b.operation_id = r.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT state FROM released
