-- One operation's attempt history, for `fencebridge inspect`: oldest first, no payload, no
-- error text.
SELECT a.kind, a.fence, a.worker, a.takeover, a.started_at, a.ended_at, a.outcome,
       a.outcome_code, a.error_class, a.finding
  FROM work_attempt a
 WHERE a.tenant_id = %(tenant_id)s
   AND a.operation_id = %(operation_id)s
 ORDER BY a.id
