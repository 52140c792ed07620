-- Claim up to %(limit)s rows in one statement: queued rows that are due, and claimed rows whose
-- lease expired with attempts left (a takeover). Locks with SKIP LOCKED, bumps the fence and
-- the attempt count, and sets the lease from the database clock. Within an ordered group only
-- the earliest unsettled row is eligible. A process claims only rows written under an identity
-- key it holds (%(identity_keys)s; NULL: any), since it derives their idempotency keys. A row
-- whose (job_type, tenant_id) waits out a target's rate limit (rate_wait) is skipped by both.
-- Due rows are taken in claim order (migration 0012: the due time moved earlier by priority),
-- read in order from work_item_due; the clock they must be due by is read once, in a subquery,
-- so that the planner sizes the scan alike for every execution and keeps one plan
-- (sql.with_limit). The takeovers, the filters every claimable row passes and the end of the
-- claim are the parts claim_expired, claimable and claim_tail (store/parts/), shared with
-- claim_fair.sql (tenants in turn) and claim_limited.sql (job types with a concurrency limit).
WITH
\i claim_expired
due AS (
    SELECT w.tenant_id, w.operation_id
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= (SELECT coalesce(%(now)s::timestamptz, now()))
       AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
       \i claimable
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
