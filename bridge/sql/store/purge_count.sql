-- What a purge with this cutoff would remove now (a dry run), by the same rules as purge.sql.
WITH cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval AS at
)
SELECT (SELECT count(*) FROM work_item w, cutoff
         WHERE w.state IN ('succeeded', 'failed_terminal') AND w.settled_at < cutoff.at)
           AS work_rows,
       (SELECT count(*) FROM rejected_delivery r, cutoff
         WHERE (r.kind = 'conflict' OR r.redriven_at IS NOT NULL OR r.resolved_at IS NOT NULL)
           AND r.created_at < cutoff.at)
           AS rejected_deliveries,
       (SELECT count(*) FROM payload p
         WHERE p.payload_ref IN (
                   SELECT w.payload_ref FROM work_item w, cutoff
                    WHERE w.state IN ('succeeded', 'failed_terminal')
                      AND w.settled_at < cutoff.at
                   UNION ALL
                   SELECT r.payload_ref FROM rejected_delivery r, cutoff
                    WHERE (r.kind = 'conflict' OR r.redriven_at IS NOT NULL
                           OR r.resolved_at IS NOT NULL)
                      AND r.created_at < cutoff.at AND r.payload_ref IS NOT NULL))
           AS payloads
