-- Parked rows a redrive would consider, oldest first, with what deciding each one needs: its
-- target class, fence and intent, and (only for unknown class C rows, whose lookup needs it)
-- the payload. A plain read: every move that follows is its own guarded statement.
SELECT w.tenant_id, w.operation_id, w.state, w.subscription, w.job_type, w.target_class,
       w.schema_version, w.fence, w.attempts, w.max_attempts, w.intent_fence,
       CASE WHEN w.state = 'unknown' AND w.target_class = 'C'
            THEN (SELECT p.body FROM payload p WHERE p.payload_ref = w.payload_ref)
       END AS payload,
       w.identity_key_id
  FROM work_item w
 WHERE w.state = ANY (%(states)s::text[])
   AND (%(subscription)s::text IS NULL OR w.subscription = %(subscription)s::text)
   AND (%(tenant_id)s::text IS NULL OR w.tenant_id = %(tenant_id)s::text)
   AND (%(key_tenant_id)s::text[] IS NULL
        OR (w.tenant_id, w.operation_id) IN (
               SELECT * FROM unnest(%(key_tenant_id)s::text[], %(key_operation_id)s::text[])))
   AND (%(job_type)s::text IS NULL OR w.job_type = %(job_type)s::text)
 ORDER BY w.settled_at, w.tenant_id, w.operation_id
 LIMIT %(limit)s
