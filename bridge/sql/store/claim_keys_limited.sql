-- claim_keys.sql with concurrency limits and token rates (%(slots)s and %(rates)s, not both
-- NULL): the rule and the argument of claim_limited.sql. A takeover keeps its row's slot and
-- spends a token; a queued key is claimed only within the room fencebridge_claim_room counts
-- after taking the limited job types' locks: slots ranked per tenant (k) among new claims and
-- tokens per tenant (kt) among every run, then, among the rows within their tenant's room,
-- per job type (j, jt); takeovers first, then ingest order. A key over a limit stays as it is, no attempt used, and is claimed
-- later by claim_limited.sql once a slot or a token is free.
WITH room AS (
    SELECT * FROM fencebridge_claim_room(%(slots)s::jsonb, %(rates)s::jsonb,
                                         coalesce(%(now)s::timestamptz, now()))
),
wanted AS (
    SELECT * FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[]) AS k(tenant_id, operation_id)
     ORDER BY tenant_id, operation_id
),
\i claim_keys_locked
candidate AS (
    SELECT tenant_id, operation_id, takeover, job_type
      FROM (SELECT l.*,
                   row_number() OVER (PARTITION BY job_type ORDER BY takeover DESC, seq) AS jt,
                   row_number() OVER (PARTITION BY job_type, takeover ORDER BY seq) AS j
              FROM (SELECT l.*,
                           row_number() OVER (PARTITION BY job_type, tenant_id
                                              ORDER BY takeover DESC, seq) AS kt,
                           row_number() OVER (PARTITION BY job_type, tenant_id, takeover
                                              ORDER BY seq) AS k
                      FROM locked l) l
             WHERE NOT EXISTS (
                       SELECT 1 FROM room r
                        WHERE r.job_type = l.job_type
                          AND r.tenant_id IN (l.tenant_id, '')
                          AND (r.tokens OR NOT l.takeover)
                          AND CASE WHEN r.tokens THEN l.kt ELSE l.k END > r.room)) l
     WHERE NOT EXISTS (
               SELECT 1 FROM room r
                WHERE r.job_type = l.job_type
                  AND r.tenant_id IS NULL
                  AND (r.tokens OR NOT l.takeover)
                  AND CASE WHEN r.tokens THEN l.jt ELSE l.j END > r.room)
),
\i claim_spent
claimed AS (
    UPDATE work_item w
       SET state = 'claimed',
           fence = fencebridge_next_fence(w.fence),
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
-- Attempt history: as claim.sql records it (a takeover claimed ends the attempt it takes
-- over, as lease_lost, with that attempt's fence, owner and start read before the update; a
-- takeover left for want of a token is not touched).
lost AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code)
    SELECT l.tenant_id, l.operation_id, 'claim', l.fence, l.lease_owner,
           l.claimed_at, coalesce(%(now)s::timestamptz, now()), 'lease_lost', 'lease_expired'
      FROM locked l
      JOIN candidate c USING (tenant_id, operation_id)
     WHERE %(history)s::integer > 0
       AND l.takeover
),
trimmed AS (
    DELETE FROM work_attempt a
     USING locked l
      JOIN candidate c USING (tenant_id, operation_id)
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
