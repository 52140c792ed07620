-- Every delivery of a shadow subscription's batch with what the inbox would have made of it
-- (new, replay, conflict, quarantined and why): hashes and identifiers, never a payload.
INSERT INTO shadow_delivery (subscription, decision, tenant_id, operation_id, job_type,
                             payload_hash, reason, broker_message_id, received_at)
SELECT t.subscription, t.decision, t.tenant_id, t.operation_id, t.job_type, t.payload_hash,
       t.reason, t.broker_message_id, coalesce(%(now)s::timestamptz, now())
  FROM unnest(%(subscription)s::text[], %(decision)s::text[], %(tenant_id)s::text[],
              %(operation_id)s::text[], %(job_type)s::text[], %(payload_hash)s::bytea[],
              %(reason)s::text[], %(broker_message_id)s::text[])
           AS t(subscription, decision, tenant_id, operation_id, job_type, payload_hash, reason,
                broker_message_id)
