-- Row counts by subscription, job type, tenant and state, for the console's counts.
SELECT subscription, job_type, tenant_id, state, count(*) AS n
  FROM work_item
 GROUP BY subscription, job_type, tenant_id, state
 ORDER BY subscription, job_type, tenant_id, state
