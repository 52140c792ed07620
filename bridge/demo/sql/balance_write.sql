-- Set the balance under the claim's fence: the condition travels inside the write, so the table
-- itself refuses a claim older than the last one that wrote (no row back: fenced out). `<=` lets
-- a claim repeat its own write.
INSERT INTO demo_balance (tenant_id, operation_id, account_id, balance, currency, last_fence)
VALUES (%(tenant_id)s, %(operation_id)s, %(account_id)s, %(balance)s, %(currency)s, %(fence)s)
ON CONFLICT (tenant_id, operation_id) DO UPDATE
   SET account_id = EXCLUDED.account_id,
       balance = EXCLUDED.balance,
       currency = EXCLUDED.currency,
       last_fence = EXCLUDED.last_fence,
       writes = demo_balance.writes + 1,
       updated_at = now()
 WHERE demo_balance.last_fence <= %(fence)s
RETURNING last_fence
