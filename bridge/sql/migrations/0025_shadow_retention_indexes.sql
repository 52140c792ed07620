-- fencebridge: no transaction
-- `fencebridge purge` removes what shadow subscriptions recorded (migration 0014) before its
-- cutoff, oldest first, in bounded batches: these indexes find the old rows without reading the
-- rest. Built CONCURRENTLY, so shadow subscriptions keep recording while they are built; the
-- runner applies them statement by statement and rebuilds an index an interrupted build left
-- invalid.

-- Deliveries by the time they were received.
CREATE INDEX CONCURRENTLY IF NOT EXISTS shadow_delivery_received
    ON shadow_delivery (received_at);
-- Operations by the time they were first seen.
CREATE INDEX CONCURRENTLY IF NOT EXISTS shadow_operation_first_seen
    ON shadow_operation (first_seen_at);
