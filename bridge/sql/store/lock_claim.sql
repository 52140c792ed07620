-- Lock the work row for a same-database (class A) business write: no row means the claim is
-- gone. The lock is held until COMMIT, so no claim, sweep or settlement can move the row in
-- between (claims and sweeps skip locked rows).
SELECT fence
  FROM work_item
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
   AND fence = %(fence)s
   AND state = 'claimed'
   FOR UPDATE
