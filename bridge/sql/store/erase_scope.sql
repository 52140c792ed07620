-- The operations an erasure covers (one tenant, or one operation of it), so the caller can hash
-- each one for its tombstone; fencebridge_erase refuses if rows appear that were not hashed.
SELECT operation_id
  FROM work_item
 WHERE tenant_id = %(tenant_id)s
   AND (%(operation_id)s::text IS NULL OR operation_id = %(operation_id)s::text)
