-- One page of rejected deliveries after a cursor over their id (keyset pagination), optionally
-- only one kind and only those still awaiting a person. No payload bytes.
SELECT id, kind, reason, subscription, tenant_id, operation_id, created_at, redriven_at,
       redriven_by, redrive_outcome, resolved_at, resolved_by
  FROM rejected_delivery
 WHERE id > %(after)s::bigint
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
   AND (NOT %(open_only)s::boolean OR (redriven_at IS NULL AND resolved_at IS NULL))
 ORDER BY id
 LIMIT %(limit)s
