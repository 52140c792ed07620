-- The rows of one failure group (see console_failure_groups.sql), oldest first, with their
-- fences: what a redrive of the group selects. A null outcome code or error class matches
-- rows without one.
SELECT w.tenant_id, w.operation_id, w.fence
  FROM work_item w
  LEFT JOIN LATERAL (
        SELECT t.error_class
          FROM work_attempt t
         WHERE t.tenant_id = w.tenant_id
           AND t.operation_id = w.operation_id
           AND t.kind = 'claim'
         ORDER BY t.id DESC
         LIMIT 1) a ON true
 WHERE w.state = %(state)s
   AND w.job_type = %(job_type)s
   AND w.outcome_code IS NOT DISTINCT FROM %(outcome_code)s
   AND a.error_class IS NOT DISTINCT FROM %(error_class)s
 ORDER BY w.settled_at, w.seq
 LIMIT %(limit)s
