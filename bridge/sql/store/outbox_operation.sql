-- One operation's outbox messages, in the order they were written (never their bodies).
SELECT message_id, destination, state, fence, attempts, last_error, park_reason, created_at,
       sent_at, parked_at
  FROM outbox_message
 WHERE tenant_id = %(tenant_id)s AND operation_id = %(operation_id)s
 ORDER BY seq
