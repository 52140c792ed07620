-- Batch settlement: each row moves only while its fence is still current; returns the keys moved
-- with the fence they moved under. The same statement records the attempt of each row moved
-- (%(history)s newest kept per row; 0 records none): the row's lease_owner (kept as the last
-- owner), its claimed_at as the start, and whether the attempt began as a takeover (the one
-- before it was lost, looked up only above fence 1). A settlement the fence refuses records
-- nothing. A first attempt that succeeded (fence 1, no error class, no finding) is not
-- written again: the row itself holds all of it (claimed_at, settled_at, lease_owner, the
-- outcome) and succeeded is final, so inspect_attempts.sql reads it from the row; the most
-- common settlement writes one row, not two (docs/benchmarks.md, "Inbox to settle"). Past the newest %(history)s, the oldest entries of a row are trimmed, only where its
-- fence is high enough to hold more (at most two entries per fence).
-- The trim is gated by an EXISTS over the rows moved (evaluated once, before any join): without
-- it, a plan made while work_attempt was empty (a new deployment, a benchmark's fresh database)
-- joins from a scan of the whole of work_attempt, and the bridge's connections keep the plan
-- they made first (force_generic_plan); every settlement then read the growing history (a claim
-- of 16 rows went from 1.5 to 4 to 7 ms over a drain of 20,000 rows). Its siblings do the same.
-- The arrays go in binary (%(name)b): in text, psycopg quotes each element, and for a batch of
-- 80 settlements that cost the claimer, which writes them, half a millisecond a transaction.
-- The store encodes them itself, in one pass per array (bridge/store/arrays.py).
WITH settled AS (
    UPDATE work_item w
       SET state = t.state,
           outcome_code = t.outcome_code,
           outcome_detail = t.outcome_detail,
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM unnest(%(tenant_id)b::text[], %(operation_id)b::text[], %(fence)b::bigint[],
                  %(state)b::text[], %(outcome_code)b::text[], %(outcome_detail)b::text[],
                  %(error_class)b::text[], %(finding)b::text[])
           AS t(tenant_id, operation_id, fence, state, outcome_code, outcome_detail,
                error_class, finding)
     WHERE w.tenant_id = t.tenant_id
       AND w.operation_id = t.operation_id
       AND w.fence = t.fence
       AND w.state = 'claimed'
    RETURNING w.tenant_id, w.operation_id, w.fence, w.state, w.lease_owner, w.claimed_at,
              w.settled_at, t.outcome_code, t.error_class, t.finding
),
ended AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT s.tenant_id, s.operation_id, 'claim', s.fence, s.lease_owner,
           s.claimed_at, s.settled_at, s.state, s.outcome_code, s.error_class, s.finding
      FROM settled s
     WHERE %(history)s::integer > 0
       AND NOT (s.state = 'succeeded' AND s.fence = 1
                AND s.error_class IS NULL AND s.finding IS NULL)
),
trimmed AS (
    DELETE FROM work_attempt a
     USING settled s
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM settled y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * s.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = s.tenant_id
       AND a.operation_id = s.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = s.tenant_id
                       AND b.operation_id = s.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT tenant_id, operation_id, fence FROM settled
