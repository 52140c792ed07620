-- Insert the new operations of one batch sent as all new (the inbox's one round trip, with
-- ingest_new_check.sql after it in the same implicit transaction): the rows as
-- parts/ingest_insert_rows.sql inserts them, and the number inserted kept for the check in a
-- setting local to the transaction (fencebridge.batch_inserted), which ends with it.
--
-- The count is of the insert's own RETURNING: no table is read for it, so no plan a
-- connection keeps (made while the table was small) can make it read the table. The check
-- fails, not this statement: a statement after a failed one in a pipeline is never parsed, and
-- psycopg would take a statement it meant to prepare there for prepared.
\i ingest_insert_rows
SELECT set_config('fencebridge.batch_inserted', count(*)::text, true) FROM inserted
