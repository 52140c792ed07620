-- Messages the sink can never accept as they are (refused as invalid): parked with the reason.
UPDATE outbox_message
   SET state = 'parked', park_reason = %(reason)s, parked_at = now(), relay_fence = %(fence)s,
       attempts = attempts + 1, last_error = %(reason)s
 WHERE message_id = ANY(%(ids)s) AND destination = %(destination)s AND state = 'pending'
RETURNING message_id
