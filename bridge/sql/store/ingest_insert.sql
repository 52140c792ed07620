-- Insert the new operations of one batch (parts/ingest_insert_rows.sql says how) and return the
-- keys inserted: the keys not returned existed already (a replay or a conflict to decide).
\i ingest_insert_rows
SELECT tenant_id, operation_id FROM inserted
