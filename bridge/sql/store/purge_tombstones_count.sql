-- The tombstones a purge with this horizon would remove now (a dry run).
SELECT count(*)
  FROM erased_operation
 WHERE erased_at < coalesce(%(now)s::timestamptz, now()) - %(horizon)s::interval
