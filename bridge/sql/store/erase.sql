-- Erase one tenant, or one of its operations, leaving a tombstone per operation and a record
-- by hashes only, in one transaction: see fencebridge_erase in
-- migrations/0014_erasure_tombstones.sql.
SELECT work_rows, payloads, rejected_deliveries, redrive_audits, tombstones
  FROM fencebridge_erase(%(tenant_id)s, %(operation_id)s, %(tenant_hash)s, %(operation_hash)s,
                         %(key_id)s::smallint, %(operation_ids)s::text[],
                         %(operation_hashes)s::bytea[], %(actor)s, %(reason)s)
