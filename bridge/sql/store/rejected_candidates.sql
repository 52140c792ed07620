-- Quarantined deliveries neither redriven nor resolved, oldest first, with their raw body for
-- re-decoding.
-- Tenant and job type filters match only deliveries on which they could be read.
SELECT r.id, r.subscription, r.broker_message_id, r.tenant_id, r.operation_id, r.job_type,
       r.reason, p.body
  FROM rejected_delivery r
  LEFT JOIN payload p ON p.payload_ref = r.payload_ref
 WHERE r.kind = 'quarantined'
   AND r.redriven_at IS NULL
   AND r.resolved_at IS NULL
   AND (%(subscription)s::text IS NULL OR r.subscription = %(subscription)s::text)
   AND (%(tenant_id)s::text IS NULL OR r.tenant_id = %(tenant_id)s::text)
   AND (%(key_tenant_id)s::text[] IS NULL
        OR (r.tenant_id, r.operation_id) IN (
               SELECT * FROM unnest(%(key_tenant_id)s::text[], %(key_operation_id)s::text[])))
   AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
 ORDER BY r.id
 LIMIT %(limit)s
