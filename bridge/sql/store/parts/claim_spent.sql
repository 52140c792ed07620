-- The tokens a limited claim spends (claim_limited.sql, claim_keys_limited.sql): for each rated
-- job type, and each rated (job type, tenant), among its candidate rows, the bucket's full_at
-- moves to max(full_at, now) + n / rate, in the statement that claims and under the claim
-- locks fencebridge_claim_room took (migration 0018). %(rates)s: {"<job_type>": [runs, period,
-- burst, runs per tenant, period per tenant, burst per tenant]}, a rate being runs per period.
spent AS (
    INSERT INTO token_bucket AS b (job_type, tenant_id, full_at)
    SELECT s.job_type, s.tenant_id,
           coalesce(%(now)s::timestamptz, now())
           + ceil(s.n * s.period / s.per)::bigint * interval '1 microsecond'
      FROM (SELECT c.job_type, ''::text AS tenant_id, count(*) AS n,
                   (e.value ->> 1)::numeric AS period, (e.value ->> 0)::numeric AS per
              FROM candidate c
              JOIN jsonb_each(%(rates)s::jsonb) e ON e.key = c.job_type
             WHERE e.value ->> 0 IS NOT NULL
             GROUP BY c.job_type, e.value
            UNION ALL
            SELECT c.job_type, c.tenant_id, count(*),
                   (e.value ->> 4)::numeric, (e.value ->> 3)::numeric
              FROM candidate c
              JOIN jsonb_each(%(rates)s::jsonb) e ON e.key = c.job_type
             WHERE e.value ->> 3 IS NOT NULL
             GROUP BY c.job_type, c.tenant_id, e.value) s
        ON CONFLICT (job_type, tenant_id) DO UPDATE
       SET full_at = greatest(b.full_at, coalesce(%(now)s::timestamptz, now()))
                     + (excluded.full_at - coalesce(%(now)s::timestamptz, now()))
),
