-- Close a quarantined delivery once its re-decoded operation is in the inbox, recording who,
-- why and what the inbox made of it. Only the first redrive of a delivery closes it,
-- and never one a person resolved meanwhile.
UPDATE rejected_delivery
   SET redriven_at = coalesce(%(now)s::timestamptz, now()),
       redriven_by = %(actor)s,
       redrive_reason = %(reason)s,
       redrive_outcome = %(outcome)s
 WHERE id = %(id)s
   AND kind = 'quarantined'
   AND redriven_at IS NULL
   AND resolved_at IS NULL
RETURNING id
