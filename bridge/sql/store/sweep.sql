-- Expired claims with no attempt left become unknown: the last attempt may have acted, so the
-- outcome is neither success nor failure. One guarded statement: the row is re-checked under
-- its lock, and rows locked by a settling worker are skipped until the next sweep. The same
-- statement records each row's last attempt as lease_lost (as settle_many.sql records one).
WITH exhausted AS (
    SELECT tenant_id, operation_id
      FROM work_item
     WHERE state = 'claimed'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND attempts >= max_attempts
     ORDER BY lease_expires_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
parked AS (
    UPDATE work_item w
       SET state = 'unknown',
           outcome_code = 'lease_expired_attempts_exhausted',
           outcome_detail = 'the last attempt''s lease expired before it settled',
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM exhausted e
     WHERE w.tenant_id = e.tenant_id
       AND w.operation_id = e.operation_id
       AND w.state = 'claimed'
       AND w.lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND w.attempts >= w.max_attempts
    RETURNING w.tenant_id, w.operation_id, w.fence, w.lease_owner, w.claimed_at, w.settled_at
),
ended AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT x.tenant_id, x.operation_id, 'claim', x.fence, x.lease_owner,
           x.claimed_at, x.settled_at, 'lease_lost', 'lease_expired_attempts_exhausted', NULL, NULL
      FROM parked x
     WHERE %(history)s::integer > 0
),
trimmed AS (
    DELETE FROM work_attempt a
     USING parked x
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM parked y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * x.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = x.tenant_id
       AND a.operation_id = x.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = x.tenant_id
                       AND b.operation_id = x.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT tenant_id, operation_id, fence FROM parked
