-- One operation's delivery evidence: the first copy's arrival, its replays (delivery_copy,
-- migration 0030) and the last one's time, and its conflicting copies (rejected deliveries of
-- kind conflict) with the last one's time. One row even without a work row (then only the
-- conflicts).
SELECT w.created_at,
       (SELECT count(*) FROM delivery_copy c
         WHERE c.tenant_id = %(tenant_id)s AND c.operation_id = %(operation_id)s),
       (SELECT max(c.arrived_at) FROM delivery_copy c
         WHERE c.tenant_id = %(tenant_id)s AND c.operation_id = %(operation_id)s),
       (SELECT count(*) FROM rejected_delivery r
         WHERE r.tenant_id = %(tenant_id)s AND r.operation_id = %(operation_id)s
           AND r.kind = 'conflict'),
       (SELECT max(r.created_at) FROM rejected_delivery r
         WHERE r.tenant_id = %(tenant_id)s AND r.operation_id = %(operation_id)s
           AND r.kind = 'conflict')
  FROM (SELECT 1) AS one
  LEFT JOIN work_item w
         ON w.tenant_id = %(tenant_id)s AND w.operation_id = %(operation_id)s
