-- Parked and failed work rows grouped by cause: job type, state, outcome code and the error
-- class of the row's latest claim (from its attempt history), with the count and the first
-- and last time a row of the group settled. Largest groups first.
SELECT w.job_type, w.state, w.outcome_code, a.error_class, count(*) AS n,
       min(w.settled_at) AS first_seen, max(w.settled_at) AS last_seen
  FROM work_item w
  LEFT JOIN LATERAL (
        SELECT t.error_class
          FROM work_attempt t
         WHERE t.tenant_id = w.tenant_id
           AND t.operation_id = w.operation_id
           AND t.kind = 'claim'
         ORDER BY t.id DESC
         LIMIT 1) a ON true
 WHERE w.state IN ('unknown', 'quarantined', 'failed_terminal')
 GROUP BY w.job_type, w.state, w.outcome_code, a.error_class
 ORDER BY n DESC, w.job_type, w.state, w.outcome_code NULLS FIRST, a.error_class NULLS FIRST
 LIMIT %(limit)s
