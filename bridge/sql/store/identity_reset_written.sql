-- What was written under the identity keys: the tables where a row keeps a key's hashes or
-- derives its idempotency key (a work row, its class D intent, a rejected delivery, an
-- erasure's tombstone, a shadow record, an outbox message), one count each.
SELECT 'work rows or intents', (SELECT count(*) FROM (SELECT 1 FROM work_item LIMIT 1) w)
UNION ALL
SELECT 'rejected deliveries', (SELECT count(*) FROM (SELECT 1 FROM rejected_delivery LIMIT 1) r)
UNION ALL
SELECT 'tombstones', (SELECT count(*) FROM (SELECT 1 FROM erased_operation LIMIT 1) e)
UNION ALL
SELECT 'shadow records', (SELECT count(*) FROM (SELECT 1 FROM shadow_operation LIMIT 1) s)
UNION ALL
SELECT 'shadow deliveries', (SELECT count(*) FROM (SELECT 1 FROM shadow_delivery LIMIT 1) d)
UNION ALL
SELECT 'outbox messages', (SELECT count(*) FROM (SELECT 1 FROM outbox_message LIMIT 1) o)
