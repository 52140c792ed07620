-- Record deliveries that did not become work: payload conflicts (hash only) and undecodable
-- input (with its raw body, so it can be re-decoded once the rules change).
WITH input AS (
    SELECT *
      FROM unnest(
               %(kind)s::text[], %(reason)s::text[], %(subscription)s::text[],
               %(broker_message_id)s::text[], %(tenant_id)s::text[], %(operation_id)s::text[],
               %(job_type)s::text[], %(payload_hash)s::bytea[], %(payload_ref)s::text[],
               %(body)s::bytea[]
           ) AS t(kind, reason, subscription, broker_message_id, tenant_id, operation_id,
                  job_type, payload_hash, payload_ref, body)
),
stored AS (
    INSERT INTO payload (payload_ref, tenant_id, body)
    SELECT payload_ref, tenant_id, body FROM input WHERE body IS NOT NULL
)
INSERT INTO rejected_delivery (kind, reason, subscription, broker_message_id, tenant_id,
                               operation_id, job_type, payload_hash, payload_ref)
SELECT kind, reason, subscription, broker_message_id, tenant_id,
       operation_id, job_type, payload_hash, CASE WHEN body IS NULL THEN NULL ELSE payload_ref END
  FROM input
