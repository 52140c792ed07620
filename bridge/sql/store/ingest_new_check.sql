-- After ingest_insert_new.sql, in its implicit transaction (the inbox's one round trip for a
-- batch of new operations): fails (SQLSTATE FBNEW, migration 0022) unless the insert inserted
-- every one of the batch's %(expected)s keys (a key that existed was left as it was) and none
-- of them matches a tombstone. On failure the server rolls the whole write back; the inbox
-- writes the batch again, deciding each delivery (ingest_existing.sql, ingest_erased.sql).
--
-- A statement of its own, after the insert, for the reason ingest_erased.sql gives: an erasure
-- that deleted a row while the insert waited on it committed before this snapshot. The
-- tombstones are looked up as ingest_erased.sql does, by keyed hash (%(key_id)s,
-- %(operation_hash)s, one entry per key and hash held); with no hashes to look up by
-- (%(any_erased)s), any tombstone at all refuses the write.
SELECT fencebridge_expect(
           nullif(current_setting('fencebridge.batch_inserted', true), '')::bigint
               = %(expected)s::bigint
           AND NOT EXISTS (
               SELECT 1
                 FROM unnest(%(key_id)s::smallint[], %(operation_hash)s::bytea[])
                          AS c(key_id, operation_hash)
                 JOIN erased_operation e USING (key_id, operation_hash))
           AND NOT (%(any_erased)s AND EXISTS (SELECT 1 FROM erased_operation)),
           'every key of the batch new, and no tombstone among them')
