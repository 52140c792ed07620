-- The end of every claim of due rows and takeovers (claim.sql, claim_fair.sql,
-- claim_limited.sql): the claim itself over its candidate rows, and the attempt history. The
-- fence counts on from its epoch (migration 0029) after a failover. RETURNING names the table
-- only where a candidate has the column too: the claims stay within psycopg's statement cache.
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
    RETURNING w.tenant_id, w.operation_id, w.fence, attempts, max_attempts, subscription,
              w.job_type, target_class, schema_version, payload_hash, lease_expires_at,
              intent_fence, c.takeover, trace_context, broker_message_id, receive_count,
              ordering_key,
              (SELECT p.body FROM payload p WHERE p.payload_ref = w.payload_ref) AS payload,
              identity_key_id
),
-- Attempt history (%(history)s newest per row; 0 writes none): an attempt is recorded when it
-- ends, by the statement that ends it (settle_many.sql and its siblings); the attempt still
-- running is the work row itself. A takeover ends the attempt it takes over, as lease_lost,
-- here: its fence, owner and start are read before the update. That attempt began as a
-- takeover itself if the one before it was lost. Past the newest %(history)s, the oldest
-- entries of the rows taken over are trimmed (a row has at most two entries per fence: its
-- attempt and a redrive, so a row whose fence is too low to hold more is not looked at).
-- The trim runs only when a row was taken over (the EXISTS, a gate evaluated once): a connection
-- keeps its plan (force_generic_plan), and one planned while work_attempt was empty reads that
-- table whole for every claim, a read that grows with the history (see settle_many.sql).
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
       AND EXISTS (SELECT FROM expired)
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
