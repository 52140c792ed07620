-- The dashboard's figures over time, one point per bucket ending at each of the %(buckets)s
-- points up to now: claimed-but-stalled (claims still held whose lease had expired by then),
-- the age of the oldest unknown row, and per bucket the quarantines (rows a handler quarantined,
-- undecodable deliveries) and the takeovers of expired leases (each takeover records the
-- attempt it took over as lease_lost, lease_expired, at that moment). Read from the rows as
-- they are now, through the claimed, parked and terminal indexes; the takeovers scan the
-- bounded attempt history. A bucket holds the times t with end - step < t <= end.
WITH bounds AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now_at,
           %(bucket_seconds)s::double precision AS step,
           %(buckets)s::integer AS n
),
points AS (
    SELECT i, b.now_at - make_interval(secs => (b.n - 1 - i) * b.step) AS at
      FROM bounds b CROSS JOIN generate_series(0, b.n - 1) AS i
),
quarantines AS (
    SELECT b.n - 1 - floor(extract(epoch FROM b.now_at - q.at) / b.step)::integer AS i,
           count(*) AS hits
      FROM bounds b
     CROSS JOIN LATERAL (
           SELECT w.settled_at AS at
             FROM work_item w
            WHERE w.state = 'quarantined'
              AND w.settled_at > b.now_at - make_interval(secs => b.n * b.step)
              AND w.settled_at <= b.now_at
           UNION ALL
           SELECT r.created_at
             FROM rejected_delivery r
            WHERE r.kind = 'quarantined'
              AND r.created_at > b.now_at - make_interval(secs => b.n * b.step)
              AND r.created_at <= b.now_at) q
     GROUP BY 1
),
takeovers AS (
    SELECT b.n - 1 - floor(extract(epoch FROM b.now_at - a.ended_at) / b.step)::integer AS i,
           count(*) AS hits
      FROM bounds b
      JOIN work_attempt a
        ON a.kind = 'claim'
       AND a.outcome = 'lease_lost'
       AND a.outcome_code = 'lease_expired'
       AND a.ended_at > b.now_at - make_interval(secs => b.n * b.step)
       AND a.ended_at <= b.now_at
     GROUP BY 1
)
SELECT p.at,
       (SELECT count(*)
          FROM work_item w
         WHERE w.state = 'claimed'
           AND w.claimed_at <= p.at
           AND w.lease_expires_at < p.at) AS stalled,
       (SELECT extract(epoch FROM p.at - min(w.settled_at))
          FROM work_item w
         WHERE w.state = 'unknown'
           AND w.settled_at <= p.at) AS oldest_unknown_seconds,
       coalesce(q.hits, 0) AS quarantined,
       coalesce(t.hits, 0) AS takeovers
  FROM points p
  LEFT JOIN quarantines q ON q.i = p.i
  LEFT JOIN takeovers t ON t.i = p.i
 ORDER BY p.i
