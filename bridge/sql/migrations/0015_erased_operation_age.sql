-- fencebridge: no transaction
-- Built CONCURRENTLY, as every index after the first migration (the table is new and small, but
-- the rule keeps migrations uniform); the runner applies it statement by statement and rebuilds
-- an index an interrupted build left invalid.

-- `fencebridge purge` removes tombstones (migration 0014) past [retention] tombstone_days,
-- oldest first, in bounded batches: this index finds them without reading the rest.
CREATE INDEX CONCURRENTLY IF NOT EXISTS erased_operation_age ON erased_operation (erased_at);
