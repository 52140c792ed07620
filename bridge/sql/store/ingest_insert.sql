-- Insert the new operations of one batch (parts/ingest_insert_rows.sql says how) and return the
-- keys inserted, each with its lease where it was written claimed and the identity key it was
-- written under: the keys not returned existed already (a replay or a conflict to decide).
\i ingest_insert_rows
SELECT tenant_id, operation_id, lease_expires_at, identity_key_id, fence FROM inserted
