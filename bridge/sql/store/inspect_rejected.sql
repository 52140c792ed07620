-- The rejected deliveries recorded under one operation's key (conflicts, and quarantined
-- deliveries whose tenant and operation id could be read), oldest first. No payload bytes.
SELECT id, kind, reason, subscription, broker_message_id, payload_hash, created_at,
       redriven_at, redriven_by, redrive_reason, redrive_outcome, resolved_at, resolved_by,
       resolution_reason
  FROM rejected_delivery
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
 ORDER BY id
