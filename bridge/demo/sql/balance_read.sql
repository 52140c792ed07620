-- The balance one operation set, as the tests and the demo see it.
SELECT tenant_id, operation_id, account_id, balance, currency, last_fence, writes
  FROM demo_balance
 WHERE tenant_id = %(tenant_id)s
   AND operation_id = %(operation_id)s
