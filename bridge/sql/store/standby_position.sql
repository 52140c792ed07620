-- The WAL position a wait for the standby must see flushed: the server's current position, read
-- after the commits the wait covers (every one of them ends at or before it).
SELECT pg_current_wal_lsn()
