-- Settle a claim into a final or parked state (succeeded, failed_terminal, unknown,
-- quarantined), only while this exact claim (fence) still holds the row. The same statement
-- ends this claim's attempt record: a settlement the fence refuses ends nothing.
WITH settled AS (
    UPDATE work_item
       SET state = %(state)s,
           outcome_code = %(outcome_code)s,
           outcome_detail = %(outcome_detail)s,
           lease_owner = NULL,
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE tenant_id = %(tenant_id)s
       AND operation_id = %(operation_id)s
       AND fence = %(fence)s
       AND state = 'claimed'
    RETURNING tenant_id, operation_id, fence, state, settled_at
),
ended AS (
    UPDATE work_attempt a
       SET ended_at = s.settled_at,
           outcome = s.state,
           outcome_code = %(outcome_code)s,
           error_class = %(error_class)s,
           finding = %(finding)s
      FROM settled s
     WHERE a.tenant_id = s.tenant_id
       AND a.operation_id = s.operation_id
       AND a.kind = 'claim'
       AND a.fence = s.fence
       AND a.ended_at IS NULL
)
SELECT state FROM settled
