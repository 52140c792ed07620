-- One operation's work row, for `fencebridge inspect`: everything but the payload bytes (only
-- their size is read). The lease owner only while claimed (a settled row keeps its last owner
-- for the attempt record; the attempts name it).
SELECT w.subscription, w.job_type, w.target_class, w.schema_version, w.state, w.fence,
       w.attempts, w.max_attempts, CASE WHEN w.state = 'claimed' THEN w.lease_owner END,
       w.lease_expires_at, w.next_attempt_at,
       w.intent_fence, w.outcome_code, w.outcome_detail, w.payload_hash, w.broker_message_id,
       w.receive_count, w.ordering_key, w.created_at, w.claimed_at, w.settled_at, w.updated_at,
       (SELECT octet_length(p.body) FROM payload p WHERE p.payload_ref = w.payload_ref)
           AS payload_bytes,
       w.trace_context
  FROM work_item w
 WHERE w.tenant_id = %(tenant_id)s
   AND w.operation_id = %(operation_id)s
