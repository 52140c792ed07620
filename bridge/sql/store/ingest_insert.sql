-- Insert the new operations of one batch. The primary key decides every race: existing keys
-- are left untouched (ON CONFLICT DO NOTHING). Sequence numbers are drawn in delivery order,
-- rows are inserted in key order (so two batches with overlapping keys cannot deadlock), and
-- the payloads of the rows this statement created are stored beside them. A new row is due
-- at once, by the store's clock (the database clock unless the store was given one). A new row
-- is written under the process's identity key (%(identity_key_id)s), or else the database's
-- current (newest) key.
--
-- Its claim order (migration 0012) is now moved earlier by its %(priority)s times %(aging)s
-- seconds.
WITH input AS (
    SELECT t.*, nextval('work_item_seq') AS seq
      FROM unnest(
               %(tenant_id)s::text[], %(operation_id)s::text[], %(subscription)s::text[],
               %(job_type)s::text[], %(target_class)s::text[], %(schema_version)s::text[],
               %(payload_hash)s::bytea[], %(payload_ref)s::text[], %(body)s::bytea[],
               %(max_attempts)s::int[], %(ordering_key)s::text[], %(broker_message_id)s::text[],
               %(receive_count)s::int[], %(trace_context)s::text[], %(priority)s::int[]
           ) WITH ORDINALITY AS t(tenant_id, operation_id, subscription, job_type, target_class,
                                  schema_version, payload_hash, payload_ref, body, max_attempts,
                                  ordering_key, broker_message_id, receive_count, trace_context,
                                  priority, ord)
     ORDER BY t.ord
),
inserted AS (
    INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                           schema_version, payload_hash, payload_ref, max_attempts, seq,
                           ordering_key, broker_message_id, receive_count, trace_context,
                           next_attempt_at, created_at, updated_at, identity_key_id, priority,
                           claim_order)
    SELECT tenant_id, operation_id, subscription, job_type, target_class,
           schema_version, payload_hash, payload_ref, max_attempts, seq,
           ordering_key, broker_message_id, receive_count, trace_context,
           coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()),
           coalesce(%(identity_key_id)s::smallint,
                    (SELECT max(k.key_id) FROM identity_key k), 1),
           priority, coalesce(%(now)s::timestamptz, now())
                     - make_interval(secs => priority * %(aging)s::float8)
      FROM input
     ORDER BY tenant_id, operation_id
        ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id, payload_ref
),
stored AS (
    INSERT INTO payload (payload_ref, tenant_id, body)
    SELECT i.payload_ref, i.tenant_id, input.body
      FROM inserted i
      JOIN input USING (tenant_id, operation_id)
)
SELECT tenant_id, operation_id FROM inserted
