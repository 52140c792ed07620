-- The targets' rate limit waits still ahead (rate_wait, migration 0009), of one job type or all,
-- latest end first, each with the queued rows of its job type and tenant: the rows it holds
-- back, due or not (`fencebridge rate-wait list`).
SELECT r.job_type, r.tenant_id, r.until,
       (SELECT count(*)
          FROM work_item w
         WHERE w.tenant_id = r.tenant_id
           AND w.job_type = r.job_type
           AND w.state = 'queued') AS queued
  FROM rate_wait r
 WHERE r.until > coalesce(%(now)s::timestamptz, now())
   AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
 ORDER BY r.until DESC, r.job_type, r.tenant_id
