-- Batch settlement: each row moves only while its fence is still current; returns the keys moved
-- with the fence they moved under. The same statement ends the attempt record of each row moved.
WITH settled AS (
    UPDATE work_item w
       SET state = t.state,
           outcome_code = t.outcome_code,
           outcome_detail = t.outcome_detail,
           lease_owner = NULL,
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[], %(fence)s::bigint[],
                  %(state)s::text[], %(outcome_code)s::text[], %(outcome_detail)s::text[],
                  %(error_class)s::text[], %(finding)s::text[])
           AS t(tenant_id, operation_id, fence, state, outcome_code, outcome_detail,
                error_class, finding)
     WHERE w.tenant_id = t.tenant_id
       AND w.operation_id = t.operation_id
       AND w.fence = t.fence
       AND w.state = 'claimed'
    RETURNING w.tenant_id, w.operation_id, w.fence, w.state, w.settled_at, t.outcome_code,
              t.error_class, t.finding
),
ended AS (
    UPDATE work_attempt a
       SET ended_at = s.settled_at,
           outcome = s.state,
           outcome_code = s.outcome_code,
           error_class = s.error_class,
           finding = s.finding
      FROM settled s
     WHERE a.tenant_id = s.tenant_id
       AND a.operation_id = s.operation_id
       AND a.kind = 'claim'
       AND a.fence = s.fence
       AND a.ended_at IS NULL
)
SELECT tenant_id, operation_id, fence FROM settled
