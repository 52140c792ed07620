-- fencebridge check --probe, in its scratch schema only: the state and fence of the probe's row
-- of one job type, after the stale and the current settlement.
SELECT state, fence
  FROM work_item
 WHERE job_type = %(job_type)s
