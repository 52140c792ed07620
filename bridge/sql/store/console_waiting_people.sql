-- What awaits a person, for the console's overview: parked and failed work rows by state,
-- and open rejected deliveries (neither redriven nor resolved) by kind, each with its count
-- and the time of the oldest (a row's settling, a delivery's arrival).
SELECT 'row' AS what, state AS kind, count(*) AS n, min(coalesce(settled_at, updated_at)) AS oldest
  FROM work_item
 WHERE state IN ('unknown', 'quarantined', 'failed_terminal')
 GROUP BY state
UNION ALL
SELECT 'delivery', kind, count(*), min(created_at)
  FROM rejected_delivery
 WHERE redriven_at IS NULL
   AND resolved_at IS NULL
 GROUP BY kind
