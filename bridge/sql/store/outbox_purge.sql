-- One bounded batch of retention: messages sent before the cutoff. Pending and parked messages
-- are never purged.
WITH old AS (
    SELECT message_id
      FROM outbox_message
     WHERE state = 'sent'
       AND sent_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
     ORDER BY sent_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_message m
 USING old
 WHERE m.message_id = old.message_id AND m.state = 'sent'
RETURNING 1
