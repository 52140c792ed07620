-- What a purge with this cutoff would remove now of the shadow record (a dry run), by the same
-- rules as purge_shadow.sql.
WITH cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval AS at
)
SELECT (SELECT count(*) FROM shadow_delivery d, cutoff WHERE d.received_at < cutoff.at)
           AS shadow_deliveries,
       (SELECT count(*)
          FROM shadow_operation s, cutoff
         WHERE s.first_seen_at < cutoff.at
           AND NOT EXISTS (SELECT 1
                             FROM shadow_delivery d
                            WHERE d.tenant_id = s.tenant_id
                              AND d.operation_id = s.operation_id
                              AND d.subscription = s.subscription
                              AND d.received_at >= cutoff.at))
           AS shadow_operations
