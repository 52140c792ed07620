-- Take a destination's relay lease if nobody holds it (or its lease ran out): fence + 1.
-- No row back: another relay holds it. The fence counts on from its epoch (migration 0029), as
-- the work rows' fences do: a relay's fence after a failover is above every one before it.
INSERT INTO outbox_relay AS r (destination, owner, fence, lease_expires_at, updated_at)
VALUES (%(destination)s, %(owner)s, fencebridge_next_fence(0), now() + %(lease)s::interval,
        now())
ON CONFLICT (destination) DO UPDATE
   SET owner = EXCLUDED.owner,
       fence = fencebridge_next_fence(r.fence),
       lease_expires_at = EXCLUDED.lease_expires_at,
       updated_at = now()
 WHERE r.lease_expires_at IS NULL OR r.lease_expires_at < now()
RETURNING r.fence
