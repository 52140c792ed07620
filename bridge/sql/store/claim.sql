-- Claim up to %(limit)s rows in one statement: queued rows that are due, and claimed rows whose
-- lease expired with attempts left (a takeover). Locks with SKIP LOCKED, bumps the fence and
-- the attempt count, and sets the lease from the database clock. Within an ordered group only
-- the earliest unsettled row is eligible. A process claims only rows written under an identity
-- key it holds (%(identity_keys)s; NULL: any), since it derives their idempotency keys.
WITH expired AS (
    SELECT tenant_id, operation_id
      FROM work_item
     WHERE state = 'claimed'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND attempts < max_attempts
       AND (%(job_types)s::text[] IS NULL OR job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR identity_key_id = ANY (%(identity_keys)s::smallint[]))
     ORDER BY lease_expires_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT w.tenant_id, w.operation_id
      FROM work_item w
     WHERE w.state = 'queued'
       AND w.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
       AND (%(job_types)s::text[] IS NULL OR w.job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR w.identity_key_id = ANY (%(identity_keys)s::smallint[]))
       AND (w.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1
                 FROM work_item p
                WHERE p.subscription = w.subscription
                  AND p.ordering_key = w.ordering_key
                  AND p.seq < w.seq
                  AND p.state IN ('queued', 'claimed')))
     ORDER BY w.next_attempt_at, w.seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
candidate AS (
    SELECT tenant_id, operation_id, true AS takeover FROM expired
    UNION ALL
    SELECT tenant_id, operation_id, false AS takeover FROM due
    LIMIT %(limit)s
)
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
