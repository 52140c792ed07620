-- The operations shadow subscriptions recorded, with their first payload hash, oldest first.
SELECT tenant_id, operation_id, job_type, payload_hash
  FROM shadow_operation
 WHERE subscription = ANY (%(subscription)s::text[])
 ORDER BY first_seen_at, tenant_id, operation_id
