-- fencebridge: no transaction
-- The outbox's indexes (migration 0016), built CONCURRENTLY like every index after the first
-- migration; the runner applies them statement by statement and rebuilds an index an
-- interrupted build left invalid.

-- The relay reads a destination's pending messages in order; sent ones are in no index but
-- retention's, so the relay's cost does not grow with history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_message_pending ON outbox_message (destination, seq)
    WHERE state = 'pending';
-- Retention: sent messages by age.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_message_sent ON outbox_message (sent_at)
    WHERE state = 'sent';
-- Operator views: parked messages by destination and age.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_message_parked
    ON outbox_message (destination, parked_at)
    WHERE state = 'parked';
-- An operation's messages (inspection, erasure of a tenant).
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_message_operation
    ON outbox_message (tenant_id, operation_id);
