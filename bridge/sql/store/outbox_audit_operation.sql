-- Every resend of one operation's outbox messages, oldest first (found by its messages' ids:
-- the audit holds no raw identifier).
SELECT a.at, a.actor, a.reason, a.message_id, a.destination, a.from_state, a.to_state,
       a.attempts, a.park_reason
  FROM outbox_audit a
 WHERE a.message_id IN (SELECT m.message_id
                          FROM outbox_message m
                         WHERE m.tenant_id = %(tenant_id)s
                           AND m.operation_id = %(operation_id)s)
 ORDER BY a.id
