-- One operation's payload bytes for a console user holding the payload role, and the audit
-- entry of that view, in one statement: the console cannot read the bytes without the record.
-- The view is kept in the redrive audit (to_state 'payload_viewed', the row's state, fence and
-- attempts at the time), so the operation's history shows it and an erasure removes it with
-- the tenant's other audit rows. No row, no bytes and no entry.
WITH target AS (
    SELECT w.tenant_id, w.operation_id, w.state, w.fence, w.attempts, w.payload_ref
      FROM work_item w
     WHERE w.tenant_id = %(tenant_id)s
       AND w.operation_id = %(operation_id)s
),
audited AS (
    INSERT INTO redrive_audit (at, actor, reason, tenant_id, operation_id, from_state, to_state,
                               fence, attempts)
    SELECT coalesce(%(now)s::timestamptz, now()), %(actor)s, %(reason)s, t.tenant_id,
           t.operation_id, t.state, 'payload_viewed', t.fence, t.attempts
      FROM target t
    RETURNING at
)
SELECT p.body, a.at
  FROM target t
 CROSS JOIN audited a
  LEFT JOIN payload p ON p.payload_ref = t.payload_ref
