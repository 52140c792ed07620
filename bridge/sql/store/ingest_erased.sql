-- The operations of an ingest's batch that match a tombstone (migration 0014), with the
-- tombstone: those the insert just wrote are decided as a replay (same payload hash) or a
-- conflict, and their rows are taken back out (ingest_erased_undo.sql), in the ingest's
-- transaction.
--
-- A separate statement after the insert (sent with it in one pipeline), never part of it: an
-- erasure that deleted the row while the insert waited on it committed before this
-- statement's snapshot, so its tombstone is seen here. Each key comes with its keyed hash under
-- every identity key the process holds (%(key_id)s, %(operation_hash)s: one entry per key and
-- hash); the oldest tombstone wins. A read by primary key only: it runs for every batch that
-- inserted a row.
--
-- Before any row, a one-time filter checks that the lookup could find every tombstone:
-- fencebridge_expect_tombstone_keys (migration 0024) fails the statement (SQLSTATE FBKEY)
-- when an erasure since the process started hashed its tombstones under none of its keys. It
-- reads in a snapshot taken after this statement's, so an erasure whose tombstones the lookup
-- sees is seen there with the keys it missed.
SELECT DISTINCT ON (c.tenant_id, c.operation_id)
       c.tenant_id, c.operation_id, e.payload_hash, e.state, e.tenant_hash, e.operation_hash
  FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[], %(key_id)s::smallint[],
              %(operation_hash)s::bytea[]) AS c(tenant_id, operation_id, key_id, operation_hash)
  JOIN erased_operation e USING (key_id, operation_hash)
 WHERE (SELECT fencebridge_expect_tombstone_keys(%(key_id)s::smallint[]))
 ORDER BY c.tenant_id, c.operation_id, e.erased_at
