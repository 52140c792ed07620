-- claim.sql taking tenants in turn ([bridge] tenant_fairness): the same rule (due queued rows and
-- expired leases with attempts left, SKIP LOCKED, fence and attempt +1, lease from the database
-- clock, ordered groups, identity keys, rate waits) and the same attempt history; only the choice
-- of due rows differs. The claim walks the tenants that have queued rows, in tenant order from the
-- one after %(after)s (the last tenant this claimer served) and around, each at most once and at
-- most %(limit)s of them: two bounded descents of an index per step, never a walk from the lowest
-- tenant (its front is dead entries of rows claimed since the last vacuum), and %(after)s itself
-- when no other tenant has queued rows (its due rows are read anyway). Each tenant walked may give
-- up to what the others leave at the least (the limit less one row for each other tenant walked),
-- and at least its share by its weight (%(weights)s: {"<tenant>": weight}, 1 when absent): that
-- many of its due rows are locked in its claim order (priority, due time, ingest). So a tenant with
-- one row due leaves the rest of the claim to a flooding one, instead of halving every claim while
-- it trickles; several flooding tenants lock more rows than the claim takes, released at its
-- commit. The claim then takes the rows by their rank in their tenant over its weight, in walk
-- order (the first row of each tenant of weight 1, the first two of a tenant of weight 2, ...) up
-- to %(limit)s: a tenant with a flood of rows waits behind itself, not in front of the others.
-- (Kept under psycopg's 4 KiB cache limit once compacted.)
WITH RECURSIVE walk(tenant_id, pos, first) AS (
    SELECT t, 1, t
      FROM coalesce((SELECT min(tenant_id) FROM work_item
                      WHERE state = 'queued' AND tenant_id > %(after)s),
                    (SELECT min(tenant_id) FROM work_item
                      WHERE state = 'queued' AND tenant_id < %(after)s),
                    %(after)s) AS t
    UNION ALL
    SELECT n.t, k.pos + 1, k.first
      FROM walk k,
           coalesce((SELECT min(tenant_id) FROM work_item
                      WHERE state = 'queued' AND tenant_id > k.tenant_id),
                    (SELECT min(tenant_id) FROM work_item
                      WHERE state = 'queued' AND tenant_id < k.first)) AS n(t)
     WHERE k.pos < %(limit)s AND n.t <> k.first
),
shares AS (
    SELECT tenant_id, pos, weight,
           greatest(ceil(%(limit)s * weight::numeric / sum(weight) OVER ())::int,
                    %(limit)s + 1 - count(*) OVER ()) AS share
      FROM walk k, coalesce((%(weights)s::jsonb ->> k.tenant_id)::int, 1) AS weight
),
\i claim_expired
due AS (
    SELECT d.tenant_id, d.operation_id, s.pos,
           row_number() OVER (PARTITION BY s.pos ORDER BY d.claim_order, d.seq) / s.weight AS n
      FROM shares s
     CROSS JOIN LATERAL (
           SELECT w.*
             FROM work_item w
            WHERE w.state = 'queued'
              AND w.tenant_id = s.tenant_id
              AND w.next_attempt_at <= (SELECT coalesce(%(now)s::timestamptz, now()))
              AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
              \i claimable
            ORDER BY w.claim_order, w.seq
            LIMIT s.share
              FOR UPDATE SKIP LOCKED) d
),
candidate AS (
    SELECT tenant_id, operation_id, true AS takeover FROM expired
    UNION ALL
    (SELECT tenant_id, operation_id, false FROM due ORDER BY n, pos)
    LIMIT %(limit)s
),
\i claim_tail
