-- The first payload hash a shadow subscription saw of operations that were already recorded
-- (immutable once written, like a work row's).
SELECT s.tenant_id, s.operation_id, s.payload_hash
  FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[]) AS k(tenant_id, operation_id)
  JOIN shadow_operation s USING (tenant_id, operation_id)
 WHERE s.subscription = %(subscription)s
