-- Where the named rejected deliveries stand, for those a resolve did not close: already
-- redriven, already resolved, or (absent from the answer) never recorded, purged or erased.
SELECT id, redriven_at, redriven_by, resolved_at, resolved_by
  FROM rejected_delivery
 WHERE id = ANY (%(ids)s::bigint[])
 ORDER BY id
