-- Serialise migrators for the whole run (a session lock: some migrations run outside any
-- transaction). Only tried, never waited for: a session waiting here would sit in a statement
-- that a concurrent CREATE INDEX CONCURRENTLY of the holder must wait out, a deadlock. The
-- runner tries again with backoff. Released by migration_unlock, or when the session ends.
SELECT pg_try_advisory_lock(7310231559371101)
