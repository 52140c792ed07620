-- Messages the sink can never accept as they are (refused as invalid): parked with the reason.
-- Only while the relay's fence is current: the condition is in the write.
UPDATE outbox_message
   SET state = 'parked', park_reason = %(reason)s, parked_at = now(), relay_fence = %(fence)s,
       attempts = attempts + 1, last_error = %(reason)s
 WHERE message_id = ANY(%(ids)s) AND destination = %(destination)s AND state = 'pending'
   AND EXISTS (SELECT 1 FROM outbox_relay r
                WHERE r.destination = %(destination)s AND r.fence = %(fence)s FOR SHARE)
RETURNING message_id
