-- fencebridge: no transaction
-- Built CONCURRENTLY, so claims and settlements keep writing to work_item while it is built;
-- that cannot happen inside a transaction, so this migration runs statement by statement, each
-- with the migration's lock timeout, retried until its locks are granted. An interrupted build
-- leaves an invalid index behind; the runner drops it and builds again.

-- Purge finds terminal rows by age without scanning the table. Only succeeded and failed rows
-- are in it, so a claim (queued -> claimed) never writes to it; a settlement into a terminal
-- state adds one entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS work_item_terminal ON work_item (settled_at)
    WHERE state IN ('succeeded', 'failed_terminal');
