-- fencebridge: no transaction
-- The outbox audit's index (migration 0026), built concurrently like every index after the
-- first migration: one message's resends, for `fencebridge inspect`.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_audit_message ON outbox_audit (message_id);
