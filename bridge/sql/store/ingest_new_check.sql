-- After ingest_insert.sql, in its transaction, for a batch sent as all new (the inbox's one
-- round trip: BEGIN, insert, this check, COMMIT): fails (SQLSTATE FBNEW, migration 0022)
-- unless every key of the batch now has the row this transaction wrote (its payload_ref,
-- drawn for this write) and none of them matches a tombstone. On failure the server skips the
-- COMMIT and the whole write is rolled back; the inbox writes the batch again, deciding each
-- delivery (ingest_existing.sql, ingest_erased.sql).
--
-- A statement of its own, after the insert, for the reason ingest_erased.sql gives: an erasure
-- that deleted a row while the insert waited on it committed before this snapshot. The
-- tombstones are looked up as ingest_erased.sql does, by keyed hash (%(key_id)s,
-- %(operation_hash)s, one entry per key and hash held); with no hashes to look up by
-- (%(any_erased)s), any tombstone at all refuses the write.
SELECT fencebridge_expect(
           (SELECT count(*)
              FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[],
                          %(payload_ref)s::text[]) AS k(tenant_id, operation_id, payload_ref)
              JOIN work_item w USING (tenant_id, operation_id, payload_ref))
               = cardinality(%(tenant_id)s::text[])
           AND NOT EXISTS (
               SELECT 1
                 FROM unnest(%(key_id)s::smallint[], %(operation_hash)s::bytea[])
                          AS c(key_id, operation_hash)
                 JOIN erased_operation e USING (key_id, operation_hash))
           AND NOT (%(any_erased)s AND EXISTS (SELECT 1 FROM erased_operation)),
           'a batch of new operations')
