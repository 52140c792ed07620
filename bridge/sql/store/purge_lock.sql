-- Only one purger at a time across processes: the lock lasts until this transaction ends.
SELECT pg_try_advisory_xact_lock(7310231559371103)
