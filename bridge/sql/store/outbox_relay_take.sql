-- Take a destination's relay lease if nobody holds it (or its lease ran out): fence + 1.
-- No row back: another relay holds it.
INSERT INTO outbox_relay AS r (destination, owner, fence, lease_expires_at, updated_at)
VALUES (%(destination)s, %(owner)s, 1, now() + %(lease)s::interval, now())
ON CONFLICT (destination) DO UPDATE
   SET owner = EXCLUDED.owner,
       fence = r.fence + 1,
       lease_expires_at = EXCLUDED.lease_expires_at,
       updated_at = now()
 WHERE r.lease_expires_at IS NULL OR r.lease_expires_at < now()
RETURNING r.fence
