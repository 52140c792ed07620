-- claim.sql with concurrency limits and token rates: the claim of a process that runs a limited
-- job type. The same rule (due queued rows and expired leases with attempts left, SKIP LOCKED,
-- fence and attempt +1, lease from the database clock, ordered groups, identity keys, rate
-- waits) and the same attempt history, plus the limits (%(slots)s: {"<job_type>": [total, per
-- tenant]}) and the rates (%(rates)s: {"<job_type>": [count, period_us, burst, tenant count,
-- tenant period_us, tenant burst]}) of the limited job types this claim may take; either may be
-- NULL, not both.
--
-- A slot is held by a row in state claimed, expired lease or not: a run past its lease may
-- still be acting, so a takeover (expired) reuses its row's slot and adds none; only a row
-- leaving claimed frees one. A token is spent by every run the claim starts, a takeover too:
-- a takeover's run is another call to the target, which is what a rate protects. Both are
-- counted by fencebridge_claim_room (migration 0018): it first takes the advisory locks of
-- every limited job type of the claim, then counts with a fresh snapshot. Two claimers of one
-- key in different transactions therefore never both take the last slot or token: the second
-- waits for the first's lock, i.e. for its commit, and its count then includes the first's
-- claims and spending. due and taken skip keys with no room left so they do not fill the
-- LIMIT; rows are admitted in order (takeovers first, as claim.sql takes them) while within
-- every room of their key: first their tenant's (tenant_room: its slots, rank k, or the ''
-- row: a tenant holding nothing, counted over new claims only; its tokens, kt, over every
-- run), then, among the rows left, their job type's (candidate: slots j, tokens jt). A row
-- over a limit is left as it is: queued (or claimed with its lease expired), no attempt used.
-- expired is the takeovers claimed, which claim_tail records as lease_lost (a takeover left
-- for want of a token is not touched). spent moves the buckets of the keys claimed, in this
-- statement; the lock is held until commit, so no other claim reads them in between.
WITH room AS (
    SELECT * FROM fencebridge_claim_room(%(slots)s::jsonb, %(rates)s::jsonb,
                                         coalesce(%(now)s::timestamptz, now()))
),
taken AS (
    SELECT w.tenant_id, w.operation_id, w.job_type, w.fence, w.lease_owner, w.claimed_at,
           w.lease_expires_at, w.seq
      FROM work_item w
     WHERE w.state = 'claimed'
       AND w.lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND w.attempts < w.max_attempts
       AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR w.identity_key_id = ANY (%(identity_keys)s::smallint[]))
       AND NOT EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.job_type = w.job_type AND r.tenant_id = w.tenant_id
                          AND r.until > coalesce(%(now)s::timestamptz, now()))
       AND NOT EXISTS (SELECT 1 FROM room r
                        WHERE r.tokens AND r.job_type = w.job_type AND r.room <= 0
                          AND coalesce(r.tenant_id, w.tenant_id) = w.tenant_id)
     ORDER BY w.lease_expires_at, w.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT w.tenant_id, w.operation_id, w.job_type, w.seq, w.claim_order
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= (SELECT coalesce(%(now)s::timestamptz, now()))
       AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
       \i claimable
       AND NOT EXISTS (SELECT 1 FROM room r
                        WHERE r.job_type = w.job_type AND r.room <= 0
                          AND coalesce(r.tenant_id, w.tenant_id) = w.tenant_id)
     ORDER BY w.claim_order, w.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
ranked AS (
    SELECT c.*,
           row_number() OVER (PARTITION BY job_type, tenant_id ORDER BY pos) AS kt,
           row_number() OVER (PARTITION BY job_type, tenant_id, takeover ORDER BY pos) AS k
      FROM (SELECT t.tenant_id, t.operation_id, t.job_type, true AS takeover,
                   row_number() OVER (ORDER BY t.lease_expires_at, t.seq) AS pos
              FROM taken t
            UNION ALL
            SELECT d.tenant_id, d.operation_id, d.job_type, false,
                   %(limit)s + row_number() OVER (ORDER BY d.claim_order, d.seq)
              FROM due d) c
),
-- within the rooms of their tenant first, so that rows a tenant has no room for take none of
-- their job type's
tenant_room AS (
    SELECT c.*,
           row_number() OVER (PARTITION BY job_type ORDER BY pos) AS jt,
           row_number() OVER (PARTITION BY job_type, takeover ORDER BY pos) AS j
      FROM ranked c
     WHERE NOT EXISTS (
               SELECT 1 FROM room r
                WHERE r.job_type = c.job_type
                  AND r.tenant_id IN (c.tenant_id, '')
                  AND (r.tokens OR NOT c.takeover)
                  AND CASE WHEN r.tokens THEN c.kt ELSE c.k END > r.room)
),
candidate AS (
    SELECT tenant_id, operation_id, takeover, job_type
      FROM tenant_room c
     WHERE NOT EXISTS (
               SELECT 1 FROM room r
                WHERE r.job_type = c.job_type
                  AND r.tenant_id IS NULL
                  AND (r.tokens OR NOT c.takeover)
                  AND CASE WHEN r.tokens THEN c.jt ELSE c.j END > r.room)
     ORDER BY pos
     LIMIT %(limit)s
),
expired AS (
    SELECT t.tenant_id, t.operation_id, t.fence, t.lease_owner, t.claimed_at
      FROM taken t
      JOIN candidate c USING (tenant_id, operation_id)
),
\i claim_spent
\i claim_tail
