-- One operation's attempts, oldest first: the recorded ones (each written by the statement that
-- ended it, or by a redrive), then the attempt still running, which is the work row itself
-- while it is claimed, or the first attempt that succeeded, which is the row itself too: the
-- settlement writes no entry for it (settle_many.sql) where none exists for its fence. An entry that never ended comes from an earlier version of fencebridge,
-- which wrote attempts when they began; it is left out: its attempt is the row, or was recorded
-- again when it ended. An attempt began as a takeover when the claim before it ended with its
-- lease expired (an earlier version stored that flag on the entry itself).
SELECT kind, fence, worker,
       takeover OR (kind = 'claim' AND coalesce(lag(outcome_code) OVER (
           PARTITION BY kind ORDER BY part, id) = 'lease_expired', false)) AS takeover,
       started_at, ended_at, outcome, outcome_code, error_class, finding
  FROM (SELECT 0 AS part, a.id, a.kind, a.fence, a.worker, a.takeover, a.started_at, a.ended_at,
               a.outcome, a.outcome_code, a.error_class, a.finding
          FROM work_attempt a
         WHERE a.tenant_id = %(tenant_id)s
           AND a.operation_id = %(operation_id)s
           AND a.ended_at IS NOT NULL
        UNION ALL
        SELECT 1, 0, 'claim', w.fence, w.lease_owner, false, w.claimed_at, NULL, NULL, NULL,
               NULL, NULL
          FROM work_item w
         WHERE w.tenant_id = %(tenant_id)s
           AND w.operation_id = %(operation_id)s
           AND w.state = 'claimed'
        UNION ALL
        SELECT 1, 0, 'claim', w.fence, w.lease_owner, false, w.claimed_at, w.settled_at,
               w.state, w.outcome_code, NULL, NULL
          FROM work_item w
         WHERE w.tenant_id = %(tenant_id)s
           AND w.operation_id = %(operation_id)s
           AND w.state = 'succeeded'
           AND w.fence = 1
           AND w.claimed_at IS NOT NULL
           AND NOT EXISTS (SELECT 1
                             FROM work_attempt a
                            WHERE a.tenant_id = w.tenant_id
                              AND a.operation_id = w.operation_id
                              AND a.kind = 'claim'
                              AND a.fence = 1
                              AND a.ended_at IS NOT NULL)) attempts
 ORDER BY part, id
