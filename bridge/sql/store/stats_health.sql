-- Claimed rows whose lease expired (stalled), the age of the oldest unknown, and rejected
-- deliveries awaiting a person (neither redriven nor resolved).
SELECT (SELECT count(*)
          FROM work_item
         WHERE state = 'claimed'
           AND lease_expires_at < coalesce(%(now)s::timestamptz, now())) AS stalled,
       (SELECT extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(settled_at))
          FROM work_item
         WHERE state = 'unknown') AS oldest_unknown_seconds,
       (SELECT count(*) FROM rejected_delivery
         WHERE kind = 'conflict' AND redriven_at IS NULL AND resolved_at IS NULL) AS conflicts,
       (SELECT count(*) FROM rejected_delivery
         WHERE kind = 'quarantined' AND redriven_at IS NULL AND resolved_at IS NULL)
           AS quarantined
