-- claim.sql with concurrency limits: the claim of a process that runs a limited job type. The
-- same rule (due queued rows and expired leases with attempts left, SKIP LOCKED, fence and
-- attempt +1, lease from the database clock, ordered groups, identity keys, rate waits) and
-- the same attempt history, plus the limits (%(slots)s: {"<job_type>": [total, per tenant]}
-- of the limited job types this claim may take; never NULL here).
--
-- A slot is held by a row in state claimed, expired lease or not: a run past its lease may
-- still be acting, so a takeover (expired) reuses its row's slot and adds none; only a row
-- leaving claimed frees one. A new claim (due) takes a slot only within the room
-- fencebridge_concurrency_room (migration 0011) counts: it first takes the advisory locks of
-- every limited job type of the claim, then counts the claimed rows with a fresh snapshot. Two
-- claimers of one key in different transactions therefore never both take the last slot: the
-- second waits for the first's lock, i.e. for its commit, and its count then includes the
-- first's claims. Claims that take no new slot (takeovers) need no lock. due skips keys with no
-- room left so they do not fill the LIMIT; candidate admits due rows in order while within the
-- room of their job type (rank j) and of their tenant (rank k, or the '' row: a tenant holding
-- nothing). A row over its limit is left as it is: queued, no attempt used.
WITH room AS (
    SELECT * FROM fencebridge_concurrency_room(%(slots)s::jsonb)
),
\i claim_expired
due AS (
    SELECT w.tenant_id, w.operation_id, w.job_type, w.seq
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= (SELECT coalesce(%(now)s::timestamptz, now()))
       AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR w.identity_key_id = ANY (%(identity_keys)s::smallint[]))
       AND NOT EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.job_type = w.job_type AND r.tenant_id = w.tenant_id
                          AND r.until > coalesce(%(now)s::timestamptz, now()))
       AND (w.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1
                 FROM work_item p
                WHERE p.subscription = w.subscription
                  AND p.ordering_key = w.ordering_key
                  AND p.seq < w.seq
                  AND p.state IN ('queued', 'claimed')))
       AND NOT EXISTS (SELECT 1 FROM room r
                        WHERE r.job_type = w.job_type AND r.room <= 0
                          AND coalesce(r.tenant_id, w.tenant_id) = w.tenant_id)
     ORDER BY w.claim_order, w.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
candidate AS (
    SELECT tenant_id, operation_id, true AS takeover FROM expired
    UNION ALL
    SELECT tenant_id, operation_id, false
      FROM (SELECT d.*, row_number() OVER (PARTITION BY job_type ORDER BY seq) AS j,
                   row_number() OVER (PARTITION BY job_type, tenant_id ORDER BY seq) AS k
              FROM due d) d
     WHERE NOT EXISTS (SELECT 1 FROM room r
                        WHERE r.job_type = d.job_type
                          AND coalesce(r.tenant_id, d.tenant_id) IN (d.tenant_id, '')
                          AND CASE WHEN r.tenant_id IS NULL THEN d.j ELSE d.k END > r.room)
    LIMIT %(limit)s
),
\i claim_tail
