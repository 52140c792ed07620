-- A redrive's lookup found the effect applied under the operation's idempotency key (class C):
-- unknown becomes succeeded, audited. Guarded inside the write: the row must still be unknown
-- under the fence the lookup was made for, so a row that moved on meanwhile is left alone. The
-- same statement records the redrive and its lookup's finding in the row's attempt history.
WITH moved AS (
    UPDATE work_item w
       SET state = 'succeeded',
           outcome_code = %(outcome_code)s,
           outcome_detail = %(outcome_detail)s,
           settled_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE w.tenant_id = %(tenant_id)s
       AND w.operation_id = %(operation_id)s
       AND w.fence = %(fence)s
       AND w.state = 'unknown'
       AND w.target_class = 'C'
    RETURNING w.tenant_id, w.operation_id, w.fence, w.attempts
),
audited AS (
    INSERT INTO redrive_audit (actor, reason, tenant_id, operation_id, from_state, to_state,
                               fence, attempts)
    SELECT %(actor)s, %(reason)s, tenant_id, operation_id, 'unknown', 'succeeded', fence,
           attempts
      FROM moved
),
recorded AS (
    INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at, ended_at,
                              outcome, outcome_code, finding)
    SELECT tenant_id, operation_id, 'redrive', fence, coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()), 'succeeded', %(outcome_code)s, 'applied'
      FROM moved
)
SELECT tenant_id, operation_id, fence, attempts FROM moved
