-- Insert the new operations of one batch sent as all new (the inbox's one round trip): the
-- rows as parts/ingest_insert_rows.sql inserts them, then, once every row is in, the check
-- fencebridge_expect_new_batch (migration 0023): every one of the batch's %(expected)s keys
-- inserted (a key that existed was left as it was) and none of them with a tombstone, looked
-- up by keyed hash (%(key_id)s, %(operation_hash)s: one entry per key and identity key held;
-- with none to look up by, %(any_erased)s: any tombstone refuses). Returns the rows inserted,
-- each with its lease where it was written claimed and its identity key.
--
-- One statement, its own transaction (the connection is autocommit): a failed check fails it
-- and nothing of it commits; the inbox then writes the batch the careful way. The check is a
-- one-time filter over the count of the insert's own RETURNING (no table is read for it), so
-- it runs after the insert and before any row is returned, in a function of its own: its
-- lookup takes a snapshot after the insert's, and sees the tombstone of an erasure that
-- deleted a row while the insert waited on it (see the migration).
--
-- Before 0023 the check was a second statement sent with the insert in one pipeline, which
-- cost the client more than the insert itself (docs/benchmarks.md, "Inbox to settle").
\i ingest_insert_rows
SELECT tenant_id, operation_id, lease_expires_at, identity_key_id, fence
  FROM inserted
 WHERE (SELECT fencebridge_expect_new_batch((SELECT count(*) FROM inserted), %(expected)s::bigint,
                                            %(key_id)s::smallint[], %(operation_hash)s::bytea[],
                                            %(any_erased)s::boolean))
