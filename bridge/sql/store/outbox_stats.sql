-- Per destination: pending messages, the age of the oldest one, parked messages.
SELECT destination,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending'))
           AS oldest_pending_seconds,
       count(*) FILTER (WHERE state = 'parked') AS parked
  FROM outbox_message
 WHERE state IN ('pending', 'parked')
 GROUP BY destination
 ORDER BY destination
