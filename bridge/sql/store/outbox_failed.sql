-- Messages the sink refused for now: one more failed attempt and its reason; past
-- %(max_attempts)s attempts the message is parked with that reason.
-- Only while the relay's fence is current: the condition is in the write.
UPDATE outbox_message
   SET attempts = attempts + 1,
       last_error = %(error)s,
       state = CASE WHEN attempts + 1 >= %(max_attempts)s THEN 'parked' ELSE 'pending' END,
       park_reason = CASE WHEN attempts + 1 >= %(max_attempts)s
                          THEN 'gave up after ' || (attempts + 1) || ' attempts: ' || %(error)s
                     END,
       parked_at = CASE WHEN attempts + 1 >= %(max_attempts)s THEN now() END,
       relay_fence = %(fence)s
 WHERE message_id = ANY(%(ids)s) AND destination = %(destination)s AND state = 'pending'
   AND EXISTS (SELECT 1 FROM outbox_relay r
                WHERE r.destination = %(destination)s AND r.fence = %(fence)s FOR SHARE)
RETURNING message_id, state
