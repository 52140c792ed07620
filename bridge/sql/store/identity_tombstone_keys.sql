-- The erasures none of whose tombstones (migration 0014) is under a key in %(held)s, grouped by
-- the keys their tombstones are under, with their number of erased operations: a process that
-- holds none of an erasure's keys cannot recognise a redelivery of what it erased. An erasure
-- writes every operation's tombstone under each of its keys (migration 0024), so holding one
-- of them is enough. Reads every tombstone: at a process's start and at a rotation only.
WITH per_key AS (
    SELECT erasure_id, key_id, count(*) AS n
      FROM erased_operation
     GROUP BY erasure_id, key_id
), per_erasure AS (
    SELECT erasure_id, array_agg(key_id ORDER BY key_id) AS keys, max(n) AS n,
           bool_or(key_id = ANY (%(held)s::smallint[])) AS found
      FROM per_key
     GROUP BY erasure_id
)
SELECT keys, sum(n) AS n
  FROM per_erasure
 WHERE NOT found
 GROUP BY keys
 ORDER BY keys
