-- Messages the sink accepted, marked sent (run after outbox_relay_hold, same transaction).
UPDATE outbox_message
   SET state = 'sent', sent_at = now(), relay_fence = %(fence)s, last_error = NULL
 WHERE message_id = ANY(%(ids)s) AND destination = %(destination)s AND state = 'pending'
RETURNING message_id
