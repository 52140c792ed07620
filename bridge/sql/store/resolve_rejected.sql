-- Close open rejected deliveries (conflicts, quarantined deliveries) a person has dealt with:
-- acknowledged, with who and why, on the delivery itself. The work row is never touched. The
-- guard is inside the write: a delivery redriven or resolved meanwhile is not closed again.
WITH picked AS (
    SELECT r.id
      FROM rejected_delivery r
     WHERE r.redriven_at IS NULL
       AND r.resolved_at IS NULL
       AND (%(ids)s::bigint[] IS NULL OR r.id = ANY (%(ids)s::bigint[]))
       AND (%(kind)s::text IS NULL OR r.kind = %(kind)s::text)
       AND (%(subscription)s::text IS NULL OR r.subscription = %(subscription)s::text)
       AND (%(tenant_id)s::text IS NULL OR r.tenant_id = %(tenant_id)s::text)
       AND (%(operation_id)s::text IS NULL OR r.operation_id = %(operation_id)s::text)
     ORDER BY r.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE rejected_delivery r
   SET resolved_at = coalesce(%(now)s::timestamptz, now()),
       resolved_by = %(actor)s,
       resolution_reason = %(reason)s
  FROM picked p
 WHERE r.id = p.id
   AND r.redriven_at IS NULL
   AND r.resolved_at IS NULL
RETURNING r.id, r.kind, r.subscription, r.tenant_id, r.operation_id, r.created_at
