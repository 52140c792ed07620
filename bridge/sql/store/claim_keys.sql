-- Targeted claim for hand-off: the same rule as claim.sql, restricted to the given keys (the
-- ones a consumer has just inserted). Keys that are not claimable right now are skipped, and
-- so are rows whose (job_type, tenant_id) waits out a target's rate limit (rate_wait). The
-- hand-off claim of a process that runs job types with a concurrency limit is
-- claim_keys_limited.sql. The keys go as binary arrays (%(name)b), as settle_many.sql says why.
WITH wanted AS (
    SELECT * FROM unnest(%(tenant_id)b::text[], %(operation_id)b::text[]) AS k(tenant_id, operation_id)
     ORDER BY tenant_id, operation_id
     LIMIT %(limit)s
),
\i claim_keys_locked
claimed AS (
    UPDATE work_item w
       SET state = 'claimed',
           fence = fencebridge_next_fence(w.fence),
           attempts = w.attempts + 1,
           lease_owner = %(worker)s,
           lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
           claimed_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM locked c
     WHERE w.tenant_id = c.tenant_id
       AND w.operation_id = c.operation_id
    RETURNING w.tenant_id, w.operation_id, w.fence, w.attempts, w.max_attempts, w.subscription,
              w.job_type, w.target_class, w.schema_version, w.payload_hash, w.lease_expires_at,
              w.intent_fence, c.takeover, w.trace_context, w.broker_message_id, w.receive_count,
              w.ordering_key,
              (SELECT p.body FROM payload p WHERE p.payload_ref = w.payload_ref) AS payload,
              w.identity_key_id
),
-- Attempt history: as claim.sql records it (a takeover ends the attempt it takes over, as
-- lease_lost, with that attempt's fence, owner and start read before the update; a takeover
-- is always claimed, whatever the limits).
lost AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code)
    SELECT l.tenant_id, l.operation_id, 'claim', l.fence, l.lease_owner,
           l.claimed_at, coalesce(%(now)s::timestamptz, now()), 'lease_lost', 'lease_expired'
      FROM locked l
     WHERE %(history)s::integer > 0
       AND l.takeover
),
trimmed AS (
    DELETE FROM work_attempt a
     USING locked l
     WHERE %(history)s::integer > 0
       AND l.takeover
       AND EXISTS (SELECT FROM locked y WHERE y.takeover AND 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * l.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = l.tenant_id
       AND a.operation_id = l.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = l.tenant_id
                       AND b.operation_id = l.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT tenant_id, operation_id, fence, attempts, max_attempts, subscription, job_type,
       target_class, schema_version, payload_hash, lease_expires_at, intent_fence, takeover,
       trace_context, broker_message_id, receive_count, ordering_key, payload, identity_key_id
  FROM claimed
