-- The recorded erasures that reached one operation, by keyed hashes (the record never keeps the
-- tenant or operation id): its tenant's, and its own (erase --operation), newest first. What
-- `fencebridge inspect` can still say about an operation that is gone.
SELECT at, actor, reason, operation_hash IS NOT NULL AS one_operation
  FROM erasure_audit
 WHERE tenant_hash = %(tenant_hash)s
   AND (operation_hash IS NULL OR operation_hash = %(operation_hash)s)
 ORDER BY at DESC, id DESC
