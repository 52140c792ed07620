-- Settle a claim into a final or parked state (succeeded, failed_terminal, unknown,
-- quarantined), only while this exact claim (fence) still holds the row.
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
RETURNING state
