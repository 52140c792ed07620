-- An unknown class D row whose recorded intent the target's owner has confirmed was never
-- carried out: back to the queue with the intent cleared, audited. Guarded inside the write:
-- still unknown under the fence the operator confirmed, so a row claimed meanwhile is left alone.
-- The same statement adds a redrive record to the row's attempt history.
WITH moved AS (
    UPDATE work_item w
       SET state = 'queued',
           intent_fence = NULL,
           max_attempts = w.attempts + %(extra_attempts)s,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()),
           claim_order = coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => priority * %(aging)s::float8),
           outcome_code = NULL,
           outcome_detail = NULL,
           settled_at = NULL,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE w.tenant_id = %(tenant_id)s
       AND w.operation_id = %(operation_id)s
       AND w.fence = %(fence)s
       AND w.state = 'unknown'
       AND w.target_class = 'D'
    RETURNING w.tenant_id, w.operation_id, w.fence, w.attempts
),
audited AS (
    INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state, to_state,
                               fence, attempts)
    SELECT %(actor)s, %(reason)s, tenant_id, operation_id, 'unknown', 'queued', fence, attempts
      FROM moved
),
recorded AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at, ended_at,
                              outcome, outcome_code)
    SELECT tenant_id, operation_id, 'redrive', fence, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()), 'queued', 'intent_confirmed_not_called'
      FROM moved
)
SELECT tenant_id, operation_id, fence, attempts FROM moved
