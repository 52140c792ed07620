-- fencebridge check --probe: whether a backend (the probe's second claimer) waits for a lock.
SELECT coalesce(wait_event_type = 'Lock', false)
  FROM pg_stat_activity
 WHERE pid = %(pid)s
