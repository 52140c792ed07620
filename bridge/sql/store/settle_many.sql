-- Batch settlement: each row moves only while its fence is still current; returns the keys moved
-- with the fence they moved under.
UPDATE work_item w
   SET state = t.state,
       outcome_code = t.outcome_code,
       outcome_detail = t.outcome_detail,
       lease_owner = NULL,
       lease_expires_at = NULL,
       settled_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
  FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[], %(fence)s::bigint[],
              %(state)s::text[], %(outcome_code)s::text[], %(outcome_detail)s::text[])
       AS t(tenant_id, operation_id, fence, state, outcome_code, outcome_detail)
 WHERE w.tenant_id = t.tenant_id
   AND w.operation_id = t.operation_id
   AND w.fence = t.fence
   AND w.state = 'claimed'
RETURNING w.tenant_id, w.operation_id, w.fence
