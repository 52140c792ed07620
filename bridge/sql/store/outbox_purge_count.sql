-- What an outbox purge with this age would remove right now: messages sent before the cutoff.
SELECT count(*)
  FROM outbox_message
 WHERE state = 'sent'
   AND sent_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
