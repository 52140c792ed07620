-- The recorded erasures of one tenant, by its keyed hash (the record never keeps the tenant id),
-- newest first: what `fencebridge inspect` can still say about an operation that is gone.
SELECT at, actor, reason
  FROM erasure_audit
 WHERE tenant_hash = %(tenant_hash)s
 ORDER BY at DESC, id DESC
