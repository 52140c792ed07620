-- Give the relay lease back on a clean stop, so another process takes over at once.
UPDATE outbox_relay
   SET owner = NULL, lease_expires_at = NULL, updated_at = now()
 WHERE destination = %(destination)s AND fence = %(fence)s
