-- The operations an ingest just inserted that match a tombstone (migration 0014): each one's
-- row and payload are deleted again, in the ingest's transaction, and the tombstone is
-- returned so the delivery is decided as a replay (same payload hash) or a conflict.
--
-- A separate statement after the insert, never part of it: an erasure that deleted the row
-- while the insert waited on it committed before this statement's snapshot, so its tombstone
-- is seen here. Each key comes with its keyed hash under every identity key the process holds
-- (%(key_id)s, %(operation_hash)s: one entry per key and hash); the oldest tombstone wins.
WITH candidate AS (
    SELECT *
      FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[], %(key_id)s::smallint[],
                  %(operation_hash)s::bytea[]) AS c(tenant_id, operation_id, key_id,
                                                    operation_hash)
),
hit AS (
    SELECT DISTINCT ON (c.tenant_id, c.operation_id)
           c.tenant_id, c.operation_id, e.payload_hash, e.state, e.tenant_hash,
           e.operation_hash
      FROM candidate c
      JOIN erased_operation e USING (key_id, operation_hash)
     ORDER BY c.tenant_id, c.operation_id, e.erased_at
),
rows_gone AS (
    DELETE FROM work_item w
     USING hit h
     WHERE w.tenant_id = h.tenant_id
       AND w.operation_id = h.operation_id
    RETURNING w.payload_ref
),
payloads_gone AS (
    DELETE FROM payload p
     WHERE p.payload_ref IN (SELECT payload_ref FROM rows_gone)
)
SELECT tenant_id, operation_id, payload_hash, state, tenant_hash, operation_hash FROM hit
