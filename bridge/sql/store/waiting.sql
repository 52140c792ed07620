-- Queued rows that are due and yet cannot be claimed now, per job type, tenant and reason, for
-- `fencebridge status`: `rate` while their (job_type, tenant_id) waits out a target's rate limit
-- (rate_wait), else `limit` while their job type, or their (job type, tenant), holds as many
-- claimed rows as its concurrency limit (%(slots)s, as the claims pass it; NULL: no limits).
-- A read: it takes no lock, so it is the picture of one instant, not a reservation. It is the
-- bridge's fencebridge.queue.waiting gauge too, read every refresh of the gauges.
WITH l AS (
    SELECT e.key AS job_type, (e.value ->> 0)::bigint AS total,
           (e.value ->> 1)::bigint AS per_tenant
      FROM jsonb_each(coalesce(%(slots)s::jsonb, '{}'::jsonb)) AS e
),
held AS (
    SELECT w.job_type, w.tenant_id, count(*) AS n
      FROM work_item w
      JOIN l ON l.job_type = w.job_type
     WHERE w.state = 'claimed'
     GROUP BY w.job_type, w.tenant_id
),
full_type AS (
    SELECT l.job_type
      FROM l
     WHERE l.total <= (SELECT coalesce(sum(h.n), 0) FROM held h WHERE h.job_type = l.job_type)
),
full_key AS (
    SELECT h.job_type, h.tenant_id
      FROM held h
      JOIN l ON l.job_type = h.job_type
     WHERE h.n >= l.per_tenant
),
waiting AS (
    SELECT w.job_type, w.tenant_id,
           CASE WHEN EXISTS (SELECT 1 FROM rate_wait r
                              WHERE r.job_type = w.job_type AND r.tenant_id = w.tenant_id
                                AND r.until > coalesce(%(now)s::timestamptz, now()))
                THEN 'rate'
                WHEN w.job_type IN (SELECT f.job_type FROM full_type f)
                  OR (w.job_type, w.tenant_id) IN (SELECT f.job_type, f.tenant_id FROM full_key f)
                THEN 'limit'
           END AS reason
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
       -- no limit and no wait: nothing can be waiting, and the queue is not read
       AND (%(slots)s::jsonb IS NOT NULL
            OR EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.until > coalesce(%(now)s::timestamptz, now())))
)
SELECT job_type, tenant_id, reason, count(*)
  FROM waiting
 WHERE reason IS NOT NULL
 GROUP BY job_type, tenant_id, reason
 ORDER BY job_type, tenant_id, reason
