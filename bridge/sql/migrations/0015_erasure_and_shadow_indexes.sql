-- fencebridge: no transaction
-- Built CONCURRENTLY, as every index after the first migration (the tables are new and small,
-- but the rule keeps migrations uniform); the runner applies it statement by statement and rebuilds
-- an index an interrupted build left invalid.

-- `fencebridge purge` removes tombstones (migration 0014) past [retention] tombstone_days,
-- oldest first, in bounded batches: this index finds them without reading the rest.
CREATE INDEX CONCURRENTLY IF NOT EXISTS erased_operation_age ON erased_operation (erased_at);

-- Shadow subscriptions (migration 0014): the report reads a subscription's deliveries, and an
-- erasure finds a tenant's.
CREATE INDEX CONCURRENTLY IF NOT EXISTS shadow_delivery_subscription
    ON shadow_delivery (subscription, job_type);
CREATE INDEX CONCURRENTLY IF NOT EXISTS shadow_delivery_tenant
    ON shadow_delivery (tenant_id, operation_id);
