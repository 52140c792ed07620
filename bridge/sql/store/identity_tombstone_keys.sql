-- Tombstones (migration 0014) per key id, for the keys not in %(held)s: a process that does not
-- hold a tombstone's key cannot recognise a redelivery of the erased operation.
SELECT key_id, count(*) AS n
  FROM erased_operation
 WHERE key_id <> ALL (%(held)s::smallint[])
 GROUP BY key_id
 ORDER BY key_id
