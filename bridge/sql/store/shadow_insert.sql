-- A shadow subscription's batch (migration 0014), as ingest_insert.sql would write it, into
-- shadow_operation: the first payload hash of each operation it sees; existing keys are left
-- untouched. Rows in key order, so two batches with overlapping keys cannot deadlock. Nothing
-- here is ever claimed: claims read work_item only.
INSERT INTO shadow_operation (subscription, tenant_id, operation_id, job_type, payload_hash,
                              first_seen_at)
SELECT t.subscription, t.tenant_id, t.operation_id, t.job_type, t.payload_hash,
       coalesce(%(now)s::timestamptz, now())
  FROM unnest(%(subscription)s::text[], %(tenant_id)s::text[], %(operation_id)s::text[],
              %(job_type)s::text[], %(payload_hash)s::bytea[])
           AS t(subscription, tenant_id, operation_id, job_type, payload_hash)
 ORDER BY t.tenant_id, t.operation_id, t.subscription
    ON CONFLICT (tenant_id, operation_id, subscription) DO NOTHING
RETURNING tenant_id, operation_id
