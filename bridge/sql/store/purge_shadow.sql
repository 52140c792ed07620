-- One bounded batch of what shadow subscriptions recorded (migration 0014) before the cutoff,
-- oldest first through the indexes of migration 0025: deliveries received before it, and
-- operations first seen before it of which no later delivery is kept (the report counts an
-- operation with its deliveries; a replay received since keeps it). Nothing here is work: no
-- claim reads these tables. Locked rows are skipped until the next batch.
WITH cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval AS at
),
old_deliveries AS (
    SELECT d.id
      FROM shadow_delivery d, cutoff
     WHERE d.received_at < cutoff.at
     ORDER BY d.received_at
     LIMIT %(limit)s
       FOR UPDATE OF d SKIP LOCKED
),
deliveries_gone AS (
    DELETE FROM shadow_delivery d
     USING old_deliveries o
     WHERE d.id = o.id
    RETURNING 1
),
old_operations AS (
    SELECT s.tenant_id, s.operation_id, s.subscription
      FROM shadow_operation s, cutoff
     WHERE s.first_seen_at < cutoff.at
       AND NOT EXISTS (SELECT 1
                         FROM shadow_delivery d
                        WHERE d.tenant_id = s.tenant_id
                          AND d.operation_id = s.operation_id
                          AND d.subscription = s.subscription
                          AND d.received_at >= cutoff.at)
     ORDER BY s.first_seen_at
     LIMIT %(limit)s
       FOR UPDATE OF s SKIP LOCKED
),
operations_gone AS (
    DELETE FROM shadow_operation s
     USING old_operations o
     WHERE s.tenant_id = o.tenant_id
       AND s.operation_id = o.operation_id
       AND s.subscription = o.subscription
    RETURNING 1
)
SELECT (SELECT count(*) FROM deliveries_gone) AS shadow_deliveries,
       (SELECT count(*) FROM operations_gone) AS shadow_operations
