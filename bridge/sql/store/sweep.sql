-- Expired claims with no attempt left. The last attempt may have acted, so the outcome is neither
-- success nor failure: the row becomes unknown. One exception: a class D row with no intent
-- recorded. Its executor records the intent under the fence before the one call and calls only
-- once that write committed, so no intent means no call was ever made (the rule of
-- bridge/executors/intent.py): the claim never started (the row was written claimed or
-- prefetched in a process that died, or its worker vanished before the intent). Such a row goes
-- back to the queue, due now, with one more attempt granted (as a redrive grants one), while it
-- has had fewer than %(unstarted_claims)s claims in all (its attempts); the next expiry parks it
-- unknown, so a row that takes down every process that claims it waits for a person.
--
-- One guarded statement: the row is re-checked under its lock, and rows locked by a settling
-- worker are skipped until the next sweep. The same statement records each row's last attempt as
-- lease_lost (as settle_many.sql records one), with the code the row took.
WITH exhausted AS (
    SELECT tenant_id, operation_id,
           (target_class = 'D' AND intent_fence IS NULL
            AND attempts < %(unstarted_claims)s::integer) AS requeue
      FROM work_item
     WHERE state = 'claimed'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND attempts >= max_attempts
     ORDER BY lease_expires_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
swept AS (
    UPDATE work_item w
       SET state = CASE WHEN e.requeue THEN 'queued' ELSE 'unknown' END,
           max_attempts = CASE WHEN e.requeue THEN w.attempts + 1 ELSE w.max_attempts END,
           next_attempt_at = CASE WHEN e.requeue THEN coalesce(%(now)s::timestamptz, now())
                                  ELSE w.next_attempt_at END,
           claim_order = CASE WHEN e.requeue
                              THEN coalesce(%(now)s::timestamptz, now())
                                   - make_interval(secs => w.priority * %(aging)s::float8)
                              ELSE w.claim_order END,
           outcome_code = CASE WHEN e.requeue THEN 'lease_expired_not_started'
                               ELSE 'lease_expired_attempts_exhausted' END,
           outcome_detail = CASE
               WHEN e.requeue
                   THEN 'the claim''s lease expired before it recorded an intent: the target '
                        'was never called'
               WHEN w.target_class = 'D' AND w.intent_fence IS NULL
                   THEN 'every claim''s lease expired before it recorded an intent (the target '
                        'was never called): see why its processes stop'
               ELSE 'the last attempt''s lease expired before it settled'
           END,
           lease_expires_at = NULL,
           settled_at = CASE WHEN e.requeue THEN NULL
                             ELSE coalesce(%(now)s::timestamptz, now()) END,
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM exhausted e
     WHERE w.tenant_id = e.tenant_id
       AND w.operation_id = e.operation_id
       AND w.state = 'claimed'
       AND w.lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND w.attempts >= w.max_attempts
    RETURNING w.tenant_id, w.operation_id, w.fence, w.state, w.outcome_code, w.lease_owner,
              w.claimed_at, w.updated_at
),
ended AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, worker, started_at,
                              ended_at, outcome, outcome_code, error_class, finding)
    SELECT x.tenant_id, x.operation_id, 'claim', x.fence, x.lease_owner,
           x.claimed_at, x.updated_at, 'lease_lost', x.outcome_code, NULL, NULL
      FROM swept x
     WHERE %(history)s::integer > 0
),
trimmed AS (
    DELETE FROM work_attempt a
     USING swept x
     WHERE %(history)s::integer > 0
       AND EXISTS (SELECT FROM swept y WHERE 2 * y.fence - 1 > greatest(%(history)s::integer, 2))
       AND 2 * x.fence - 1 > greatest(%(history)s::integer, 2)
       AND a.tenant_id = x.tenant_id
       AND a.operation_id = x.operation_id
       AND a.id <= (SELECT b.id
                      FROM work_attempt b
                     WHERE b.tenant_id = x.tenant_id
                       AND b.operation_id = x.operation_id
                     ORDER BY b.id DESC
                    OFFSET greatest(%(history)s::integer, 2) - 1
                     LIMIT 1)
)
SELECT tenant_id, operation_id, fence, state FROM swept
