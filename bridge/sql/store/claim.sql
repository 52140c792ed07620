-- Claim up to %(limit)s rows in one statement: queued rows that are due, and claimed rows whose
-- lease expired with attempts left (a takeover). Locks with SKIP LOCKED, bumps the fence and
-- the attempt count, and sets the lease from the database clock. Within an ordered group only
-- the earliest unsettled row is eligible. A process claims only rows written under an identity
-- key it holds (%(identity_keys)s; NULL: any), since it derives their idempotency keys. A row
-- whose (job_type, tenant_id) waits out a target's rate limit (rate_wait) is skipped by both.
-- Due rows are taken in claim order (migration 0012: the due time moved earlier by priority),
-- read in order from work_item_due; the clock they must be due by is read once, in a subquery,
-- so that the planner sizes the scan alike for every execution and keeps one plan
-- (sql.with_limit). The takeovers and the end of the claim are the parts claim_expired and
-- claim_tail (store/parts/), shared with claim_fair.sql (tenants in turn) and claim_limited.sql
-- (job types with a concurrency limit).
WITH
\i claim_expired
due AS (
    SELECT w.tenant_id, w.operation_id
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
     ORDER BY w.claim_order, w.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
candidate AS (
    SELECT tenant_id, operation_id, true AS takeover FROM expired
    UNION ALL
    SELECT tenant_id, operation_id, false FROM due
    LIMIT %(limit)s
),
\i claim_tail
