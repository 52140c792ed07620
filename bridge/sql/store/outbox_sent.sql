-- Messages the sink accepted, marked sent, only while the relay's fence is current (the
-- condition is in the write; outbox_relay_hold, earlier in the transaction, names the loss).
UPDATE outbox_message
   SET state = 'sent', sent_at = now(), relay_fence = %(fence)s, last_error = NULL
 WHERE message_id = ANY(%(ids)s) AND destination = %(destination)s AND state = 'pending'
   AND EXISTS (SELECT 1 FROM outbox_relay r
                WHERE r.destination = %(destination)s AND r.fence = %(fence)s FOR SHARE)
RETURNING message_id
