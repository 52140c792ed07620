-- Queued rows that are due and yet cannot be claimed now, per job type, tenant and reason, for
-- `fencebridge status`: `rate` while their (job_type, tenant_id) waits out a target's rate limit
-- (rate_wait) or while the token bucket of their job type, or of their (job type, tenant), holds
-- no whole token (%(rates)s, as the claims pass them; NULL: no rates; migration 0018), else
-- `limit` while their job type, or their (job type, tenant), holds as many claimed rows as its
-- concurrency limit (%(slots)s, as the claims pass it; NULL: no limits).
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
       AND w.lease_expires_at IS NOT NULL  -- the same rows, read from work_item_lease
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
r AS (
    SELECT e.key AS job_type,
           (e.value ->> 0)::numeric AS n, (e.value ->> 1)::numeric AS period,
           (e.value ->> 2)::bigint AS burst,
           (e.value ->> 3)::numeric AS tenant_n, (e.value ->> 4)::numeric AS tenant_period,
           (e.value ->> 5)::bigint AS tenant_burst
      FROM jsonb_each(coalesce(%(rates)s::jsonb, '{}'::jsonb)) AS e
),
-- buckets with less than one token: full_at more than one token's time ahead
empty_type AS (
    SELECT r.job_type
      FROM r
      JOIN token_bucket b ON b.job_type = r.job_type AND b.tenant_id = ''
     WHERE r.n IS NOT NULL
       AND r.burst - extract(epoch FROM b.full_at - coalesce(%(now)s::timestamptz, now()))
                     * 1000000 * r.n / r.period < 1
),
empty_key AS (
    SELECT r.job_type, b.tenant_id
      FROM r
      JOIN token_bucket b ON b.job_type = r.job_type AND b.tenant_id <> ''
     WHERE r.tenant_n IS NOT NULL
       AND r.tenant_burst - extract(epoch FROM b.full_at - coalesce(%(now)s::timestamptz, now()))
                            * 1000000 * r.tenant_n / r.tenant_period < 1
),
waiting AS (
    SELECT w.job_type, w.tenant_id,
           CASE WHEN EXISTS (SELECT 1 FROM rate_wait r
                              WHERE r.job_type = w.job_type AND r.tenant_id = w.tenant_id
                                AND r.until > coalesce(%(now)s::timestamptz, now()))
                  OR w.job_type IN (SELECT e.job_type FROM empty_type e)
                  OR (w.job_type, w.tenant_id) IN (SELECT e.job_type, e.tenant_id FROM empty_key e)
                THEN 'rate'
                WHEN w.job_type IN (SELECT f.job_type FROM full_type f)
                  OR (w.job_type, w.tenant_id) IN (SELECT f.job_type, f.tenant_id FROM full_key f)
                THEN 'limit'
           END AS reason
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
       -- no limit, no rate and no wait: nothing can be waiting, and the queue is not read
       AND (%(slots)s::jsonb IS NOT NULL
            OR %(rates)s::jsonb IS NOT NULL
            OR EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.until > coalesce(%(now)s::timestamptz, now())))
)
SELECT job_type, tenant_id, reason, count(*)
  FROM waiting
 WHERE reason IS NOT NULL
 GROUP BY job_type, tenant_id, reason
 ORDER BY job_type, tenant_id, reason
