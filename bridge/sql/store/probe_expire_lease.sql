-- fencebridge check --probe, in its scratch schema only: end the lease of the probe's claimed
-- row of one job type a minute ago, so the next claim is a takeover (no waiting for a lease).
UPDATE work_item
   SET lease_expires_at = now() - interval '1 minute'
 WHERE job_type = %(job_type)s
   AND state = 'claimed'
RETURNING operation_id
