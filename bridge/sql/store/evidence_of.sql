-- One operation's delivery evidence: the first copy's arrival, the replays counted on its row
-- and the last one's time, and its conflicting copies (rejected deliveries of kind conflict)
-- with the last one's time. One row even without a work row (then only the conflicts).
SELECT w.created_at, coalesce(w.replays, 0), w.last_replay_at,
       (SELECT count(*) FROM rejected_delivery r
         WHERE r.tenant_id = %(tenant_id)s AND r.operation_id = %(operation_id)s
           AND r.kind = 'conflict'),
       (SELECT max(r.created_at) FROM rejected_delivery r
         WHERE r.tenant_id = %(tenant_id)s AND r.operation_id = %(operation_id)s
           AND r.kind = 'conflict')
  FROM (SELECT 1) AS one
  LEFT JOIN work_item w
         ON w.tenant_id = %(tenant_id)s AND w.operation_id = %(operation_id)s
