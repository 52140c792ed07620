-- Expired claims with no attempt left become unknown: the last attempt may have acted, so the
-- outcome is neither success nor failure. One guarded statement: the row is re-checked under
-- its lock, and rows locked by a settling worker are skipped until the next sweep. The same
-- statement ends each row's last attempt record as lease_lost.
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
           lease_owner = NULL,
           lease_expires_at = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM exhausted e
     WHERE w.tenant_id = e.tenant_id
       AND w.operation_id = e.operation_id
       AND w.state = 'claimed'
       AND w.lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND w.attempts >= w.max_attempts
    RETURNING w.tenant_id, w.operation_id, w.fence, w.settled_at
),
ended AS (
    UPDATE work_attempt a
       SET ended_at = p.settled_at,
           outcome = 'lease_lost',
           outcome_code = 'lease_expired_attempts_exhausted'
      FROM parked p
     WHERE a.tenant_id = p.tenant_id
       AND a.operation_id = p.operation_id
       AND a.kind = 'claim'
       AND a.fence = p.fence
       AND a.ended_at IS NULL
)
SELECT tenant_id, operation_id, fence FROM parked
