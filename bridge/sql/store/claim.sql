-- Claim up to %(limit)s rows in one statement: queued rows that are due, and claimed rows whose
-- lease expired with attempts left (a takeover). Locks with SKIP LOCKED, bumps the fence and
-- the attempt count, and sets the lease from the database clock. Within an ordered group only
-- the earliest unsettled row is eligible. A process claims only rows written under an identity
-- key it holds (%(identity_keys)s; NULL: any), since it derives their idempotency keys. A row
-- whose (job_type, tenant_id) waits out a target's rate limit (rate_wait) is skipped by both.
-- Due rows are taken in claim order (migration 0012: each tenant's fair turn, moved earlier by
-- its priority), read in order from work_item_due; the clock they must be due by is read once,
-- in a subquery, so that the planner sizes the scan alike for every execution and keeps one
-- plan (sql.with_limit). The claim of job types with a concurrency limit is claim_limited.sql.
WITH expired AS (
    SELECT tenant_id, operation_id, fence, lease_owner, claimed_at
      FROM work_item
     WHERE state = 'claimed'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND attempts < max_attempts
       AND (%(job_types)s::text[] IS NULL OR job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR identity_key_id = ANY (%(identity_keys)s::smallint[]))
       AND NOT EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.job_type = work_item.job_type AND r.tenant_id = work_item.tenant_id
                          AND r.until > coalesce(%(now)s::timestamptz, now()))
     ORDER BY lease_expires_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
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
claimed AS (
    UPDATE work_item w
       SET state = 'claimed',
           fence = w.fence + 1,
           attempts = w.attempts + 1,
           lease_owner = %(worker)s,
           lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
           claimed_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM candidate c
     WHERE w.tenant_id = c.tenant_id
       AND w.operation_id = c.operation_id
    RETURNING w.tenant_id, w.operation_id, w.fence, w.attempts, w.max_attempts, w.subscription,
              w.job_type, w.target_class, w.schema_version, w.payload_hash, w.lease_expires_at,
              w.intent_fence, c.takeover, w.trace_context, w.broker_message_id, w.receive_count,
              w.ordering_key,
              (SELECT p.body FROM payload p WHERE p.payload_ref = w.payload_ref) AS payload,
              w.identity_key_id
),
-- Attempt history (%(history)s newest per row; 0 writes none): an attempt is recorded when it
-- ends, by the statement that ends it (settle_many.sql and its siblings); the attempt still
-- running is the work row itself. A takeover ends the attempt it takes over, as lease_lost,
-- here: its fence, owner and start are read before the update. That attempt began as a
-- takeover itself if the one before it was lost. Past the newest %(history)s, the oldest
-- entries of the rows taken over are trimmed (a row has at most two entries per fence: its
-- attempt and a redrive, so a row whose fence is too low to hold more is not looked at).
lost AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code)
    SELECT e.tenant_id, e.operation_id, 'claim', e.fence, e.lease_owner,
           e.claimed_at, coalesce(%(now)s::timestamptz, now()), 'lease_lost', 'lease_expired'
      FROM expired e
     WHERE %(history)s::integer > 0
),
trimmed AS (
    DELETE FROM work_attempt a
     USING expired e
     WHERE %(history)s::integer > 0
       AND 2 * e.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = e.tenant_id
       AND a.operation_id = e.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = e.tenant_id
                       AND b.operation_id = e.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT * FROM claimed
