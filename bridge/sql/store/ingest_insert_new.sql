-- Insert the new operations of one batch sent as all new (the inbox's one round trip, with
-- ingest_new_check.sql after it in the same implicit transaction): the rows as
-- parts/ingest_insert_rows.sql inserts them, and the number inserted kept for the check in a
-- setting local to the transaction (fencebridge.batch_inserted), which ends with it. Returns
-- the rows inserted, each with its lease where it was written claimed and its identity key.
--
-- The count is of the insert's own RETURNING: no table is read for it, so no plan a
-- connection keeps (made while the table was small) can make it read the table. The check
-- fails, not this statement: a statement after a failed one in a pipeline is never parsed, and
-- psycopg would take a statement it meant to prepare there for prepared.
\i ingest_insert_rows
-- With no row inserted the setting is never set, and the check refuses as it must.
SELECT tenant_id, operation_id, lease_expires_at, identity_key_id,
       set_config('fencebridge.batch_inserted', (count(*) OVER ())::text, true)
  FROM inserted
