-- Send parked rows (unknown, quarantined) back to the queue with their identity, fence history
-- and attempt count intact; they get %(extra_attempts)s more attempts. The next claim therefore
-- has attempts > 1 and reconciles before acting. Every row moved is audited, and the same
-- statement adds a redrive record to its attempt history (trimmed by the next claim).
WITH picked AS (
    SELECT tenant_id, operation_id, state, fence, attempts
      FROM work_item
     WHERE state = ANY (%(states)s::text[])
       AND (%(subscription)s::text IS NULL OR subscription = %(subscription)s::text)
       AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
       AND (%(job_type)s::text IS NULL OR job_type = %(job_type)s::text)
       AND (%(key_tenant_id)s::text[] IS NULL
            OR (tenant_id, operation_id) IN (
                   SELECT * FROM unnest(%(key_tenant_id)s::text[], %(key_operation_id)s::text[])))
       -- A redrive decided per row names the fence it decided at: a row claimed since (and
       -- parked again under a newer fence) is not moved on the strength of that decision.
       AND (%(key_fence)s::bigint[] IS NULL
            OR (tenant_id, operation_id, fence) IN (
                   SELECT * FROM unnest(%(key_tenant_id)s::text[], %(key_operation_id)s::text[],
                                        %(key_fence)s::bigint[])))
     ORDER BY settled_at, tenant_id, operation_id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE work_item w
       SET state = 'queued',
           max_attempts = w.attempts + %(extra_attempts)s,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()),
           claim_order = coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => w.priority * %(aging)s::float8),
           outcome_code = NULL,
           outcome_detail = NULL,
           settled_at = NULL,
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM picked p
     WHERE w.tenant_id = p.tenant_id
       AND w.operation_id = p.operation_id
       AND w.state = p.state
    RETURNING w.tenant_id, w.operation_id, p.state AS from_state, w.fence, w.attempts
),
audited AS (
    INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state, to_state,
                               fence, attempts)
    SELECT %(actor)s, %(reason)s, tenant_id, operation_id, from_state, 'queued', fence, attempts
      FROM moved
),
recorded AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at, ended_at,
                              outcome, outcome_code)
    SELECT tenant_id, operation_id, 'redrive', fence, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()), 'queued', 'redriven_from_' || from_state
      FROM moved
)
SELECT tenant_id, operation_id, from_state, fence, attempts FROM moved
