-- Renew the relay lease under its fence; no row back: a takeover happened (fence moved on).
UPDATE outbox_relay
   SET lease_expires_at = now() + %(lease)s::interval, updated_at = now()
 WHERE destination = %(destination)s AND fence = %(fence)s
RETURNING fence
