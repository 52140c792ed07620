-- Settle a claim into a final or parked state (succeeded, failed_terminal, unknown,
-- quarantined), only while this exact claim (fence) still holds the row. The same statement
-- records this claim's attempt as settle_many.sql does: a settlement the fence refuses
-- records nothing, and a first attempt that succeeded is its row (inspect_attempts.sql).
WITH settled AS (
    UPDATE work_item
       SET state = %(state)s,
           outcome_code = %(outcome_code)s,
           outcome_detail = %(outcome_detail)s,
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, fence, state, lease_owner, claimed_at, settled_at
),
ended AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT s.tenant_id, s.operation_id, 'claim', s.fence, s.lease_owner,
           s.claimed_at, s.settled_at, s.state, %(outcome_code)s, %(error_class)s, %(finding)s
      FROM settled s
     WHERE %(history)s::integer > 0
       AND NOT (s.state = 'succeeded' AND s.fence = 1
                AND %(error_class)s::text IS NULL AND %(finding)s::text IS NULL)
),
trimmed AS (
    DELETE FROM work_attempt a
     USING settled s
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM settled y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * s.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = s.tenant_id
       AND a.operation_id = s.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = s.tenant_id
                       AND b.operation_id = s.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT state FROM settled
