-- Every redrive of one operation, oldest first.
SELECT at, actor, reason, from_state, to_state, fence, attempts
  FROM redrive_audit
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
 ORDER BY id
