-- One page of work rows in one state, in order of their sequence number, after a cursor (keyset
-- pagination: never OFFSET, so a page costs the same however deep it is). No payload bytes.
SELECT w.seq, w.tenant_id, w.operation_id, w.subscription, w.job_type, w.target_class,
       w.state, w.fence, w.attempts, w.max_attempts, w.outcome_code, w.created_at,
       w.claimed_at, w.settled_at, w.lease_expires_at
  FROM work_item w
 WHERE w.state = %(state)s::text
   AND w.seq > %(after)s::bigint
   AND (%(subscription)s::text IS NULL OR w.subscription = %(subscription)s::text)
   AND (%(job_type)s::text IS NULL OR w.job_type = %(job_type)s::text)
 ORDER BY w.seq
 LIMIT %(limit)s
