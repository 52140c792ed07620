-- Lift the rate limit waits (rate_wait, migration 0009) of one job type, for one tenant or every
-- tenant, that an operator knows to be over (`fencebridge rate-wait clear`). The waits still
-- ahead are deleted, so the claims take their keys again at once, and the queued rows each wait
-- scheduled become due now: those whose next attempt is still ahead and no later than the
-- wait's end (the rows the target refused, and a retry due within the wait). Each row moved is
-- audited as a redrive is, in the same statement: a redrive_audit entry (actor, reason, its
-- fence and attempts, queued to queued) and a redrive entry in its attempt history
-- (rate_wait_lifted). The rows of a wait that were due already are claimable once it is gone;
-- they are not written. A dry run executes it and rolls back.
WITH lifted AS (
    DELETE FROM rate_wait r
     WHERE r.job_type = %(job_type)s
       AND (%(tenant_id)s::text IS NULL OR r.tenant_id = %(tenant_id)s::text)
       AND r.until > coalesce(%(now)s::timestamptz, now())
    RETURNING r.job_type, r.tenant_id, r.until
),
moved AS (
    UPDATE work_item w
       SET next_attempt_at = coalesce(%(now)s::timestamptz, now()),
           claim_order = coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => w.priority * %(aging)s::float8),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM lifted l
     WHERE w.tenant_id = l.tenant_id
       AND w.job_type = l.job_type
       AND w.state = 'queued'
       AND w.next_attempt_at > coalesce(%(now)s::timestamptz, now())
       AND w.next_attempt_at <= l.until
    RETURNING w.tenant_id, w.operation_id, w.job_type, w.fence, w.attempts
),
audited AS (
    INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state, to_state,
                               fence, attempts)
    SELECT %(actor)s, %(reason)s, tenant_id, operation_id, 'queued', 'queued', fence, attempts
      FROM moved
),
recorded AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at, ended_at,
                              outcome, outcome_code)
    SELECT tenant_id, operation_id, 'redrive', fence, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()), 'queued', 'rate_wait_lifted'
      FROM moved
)
SELECT l.job_type, l.tenant_id, l.until,
       (SELECT count(*) FROM moved m
         WHERE m.tenant_id = l.tenant_id AND m.job_type = l.job_type) AS moved
  FROM lifted l
 ORDER BY l.tenant_id
