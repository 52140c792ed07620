-- The stored hash and state of keys that already existed. The hash is immutable once written,
-- so comparing it after the insert cannot race with a writer.
SELECT w.tenant_id, w.operation_id, w.payload_hash, w.state
  FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[]) AS k(tenant_id, operation_id)
  JOIN work_item w USING (tenant_id, operation_id)
