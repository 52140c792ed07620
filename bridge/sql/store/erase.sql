-- Erase one tenant, or one of its operations, leaving a tombstone per operation under every
-- identity key the process holds (%(key_ids)s; the hash of operation i under key j is
-- %(operation_hashes)s[(i - 1) * number of keys + j]) and a record by hashes only, in one
-- transaction; refused while a row in scope is open or an outbox message in scope unsent
-- (parked ones dropped where %(drop_parked)s): see fencebridge_erase_under_keys in
-- migrations/0024_erasure_under_every_key.sql.
SELECT work_rows, payloads, rejected_deliveries, redrive_audits, tombstones, outbox_sent,
       outbox_parked, missed_keys
  FROM fencebridge_erase_under_keys(%(tenant_id)s, %(operation_id)s, %(tenant_hash)s,
                                    %(operation_hash)s, %(key_ids)s::smallint[],
                                    %(operation_ids)s::text[], %(operation_hashes)s::bytea[],
                                    %(actor)s, %(reason)s, %(drop_parked)s::boolean)
