-- The migration's lock timeout, for the current transaction (is_local) or the session: a DDL
-- statement waiting for a lock queues every later query on that table behind it, so it waits
-- only briefly, gives way and is tried again.
SELECT set_config('lock_timeout', %(lock_timeout)s, %(is_local)s)
