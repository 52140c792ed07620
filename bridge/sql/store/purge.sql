-- One bounded batch of retention: terminal work rows (succeeded, failed_terminal) settled before
-- the cutoff, closed rejected deliveries (conflicts; quarantines redriven or resolved) recorded
-- before it, and the payloads of both. Rows parked as unknown or quarantined, and quarantined
-- deliveries nobody has redriven or resolved, are never touched. Locked rows are skipped until
-- the next batch.
WITH cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval AS at
),
old_rows AS (
    SELECT w.tenant_id, w.operation_id
      FROM work_item w, cutoff
     WHERE w.state IN ('succeeded', 'failed_terminal')
       AND w.settled_at < cutoff.at
     ORDER BY w.settled_at
     LIMIT %(limit)s
       FOR UPDATE OF w SKIP LOCKED
),
rows_gone AS (
    DELETE FROM work_item w
     USING old_rows o
     WHERE w.tenant_id = o.tenant_id
       AND w.operation_id = o.operation_id
       AND w.state IN ('succeeded', 'failed_terminal')
    RETURNING w.payload_ref
),
old_rejected AS (
    SELECT r.id
      FROM rejected_delivery r, cutoff
     WHERE (r.kind = 'conflict' OR r.redriven_at IS NOT NULL OR r.resolved_at IS NOT NULL)
       AND r.created_at < cutoff.at
     ORDER BY r.created_at
     LIMIT %(limit)s
       FOR UPDATE OF r SKIP LOCKED
),
rejected_gone AS (
    DELETE FROM rejected_delivery r
     USING old_rejected o
     WHERE r.id = o.id
    RETURNING r.payload_ref
),
payloads_gone AS (
    DELETE FROM payload p
     WHERE p.payload_ref IN (SELECT payload_ref FROM rows_gone
                             UNION ALL
                             SELECT payload_ref FROM rejected_gone WHERE payload_ref IS NOT NULL)
    RETURNING 1
)
SELECT (SELECT count(*) FROM rows_gone) AS work_rows,
       (SELECT count(*) FROM rejected_gone) AS rejected_deliveries,
       (SELECT count(*) FROM payloads_gone) AS payloads
