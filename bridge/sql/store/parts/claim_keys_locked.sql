-- The handed keys' claimable rows, locked (claim_keys.sql, claim_keys_limited.sql): each key is
-- looked up on its own, by the primary key, in key order. Written as a join of the keys to
-- work_item, or with the state tested as an OR of states, a plan made while the table was small
-- (both cost the same then) reached the keys through the partial indexes of open rows: every
-- open row of the tenant, and every dead entry those indexes hold until a vacuum, read to find
-- a handful of keys (40 ms a claim at 20,000 rows). A CASE on the state proves no index
-- predicate, so the primary key is the only index that serves.
locked AS (
    SELECT w.*
      FROM wanted
     CROSS JOIN LATERAL (
            SELECT w.tenant_id, w.operation_id, (w.state = 'claimed') AS takeover, w.job_type,
                   w.seq, w.fence, w.lease_owner, w.claimed_at
              FROM work_item w
             WHERE w.tenant_id = wanted.tenant_id
               AND w.operation_id = wanted.operation_id
               AND CASE w.state
                       WHEN 'queued' THEN w.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
                       WHEN 'claimed' THEN w.lease_expires_at < coalesce(%(now)s::timestamptz, now())
                                           AND w.attempts < w.max_attempts
                       ELSE false
                   END
               \i claimable
               FOR UPDATE OF w SKIP LOCKED
           ) w
),
