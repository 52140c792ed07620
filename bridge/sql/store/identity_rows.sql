-- Rows per key id: open ones (may still run or be redriven) and all of them. Reads the whole
-- table: for `fencebridge identity status`, never on a hot path.
SELECT identity_key_id,
       count(*) FILTER (WHERE state NOT IN ('succeeded', 'failed_terminal')) AS open,
       count(*) AS total
  FROM work_item
 GROUP BY identity_key_id
 ORDER BY identity_key_id
