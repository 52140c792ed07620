-- Take back out the rows (and payloads) an ingest inserted for operations that turned out to be
-- erased (ingest_erased.sql), in the same transaction: they never become work.
WITH rows_gone AS (
    DELETE FROM work_item w
     USING unnest(%(tenant_id)s::text[], %(operation_id)s::text[]) AS k(tenant_id, operation_id)
     WHERE w.tenant_id = k.tenant_id
       AND w.operation_id = k.operation_id
    RETURNING w.payload_ref
)
DELETE FROM payload p
 WHERE p.payload_ref IN (SELECT payload_ref FROM rows_gone)
