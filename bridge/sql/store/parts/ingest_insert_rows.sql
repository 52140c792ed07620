-- Insert the new operations of one batch. The primary key decides every race: existing keys
-- are left untouched (ON CONFLICT DO NOTHING). Sequence numbers are drawn in delivery order,
-- rows are inserted in key order (so two batches with overlapping keys cannot deadlock), and
-- the payloads of the rows this statement created are stored beside them. A new row is due
-- at once, by the store's clock (the database clock unless the store was given one; read once,
-- as input.at, which keeps ingest_batch.sql within psycopg's 4 KiB cache). A new row
-- is written under the process's identity key (%(identity_key_id)s), or else the database's
-- current (newest) key.
--
-- Its claim order (migration 0012) is now moved earlier by its priority times %(aging)s
-- seconds.
--
-- The batch comes as one JSON array (%(rows)s), one array of columns per delivery in the order
-- the input below reads them (the payload hash in hex), and the bodies as one binary bytea[]
-- (%(body)b), in the same order: a Python client converts fifteen arrays of ten elements in
-- about nine times the CPU it takes to write that one JSON text.
--
-- A delivery the process's own pool has a free slot for comes with a lease (its last column,
-- in seconds; null: none) and is written claimed, as the hand-off claim (claim_keys.sql) would
-- claim it a moment later: fence 1 of its epoch (migration 0029), attempt 1, leased to
-- %(worker)s from the same clock. The
-- store asks this only for a row that claim would take (a job type the pool runs, with no
-- concurrency limit or token rate, no ordering key, under an identity key the process holds);
-- a row whose (job type, tenant) waits out a target's rate limit (rate_wait) is written queued
-- all the same, as that claim would skip it. One write instead of an insert and an update: the
-- row's claim costs no statement, no second version of the row and no second set of index
-- entries (docs/benchmarks.md, "Inbox to settle, end to end").
WITH input AS (
    SELECT r->>0 AS tenant_id, r->>1 AS operation_id, r->>2 AS subscription, r->>3 AS job_type,
           r->>4 AS target_class, r->>5 AS schema_version, decode(r->>6, 'hex') AS payload_hash,
           r->>7 AS payload_ref, (%(body)b::bytea[])[t.ord] AS body, (r->>8)::int AS max_attempts,
           r->>9 AS ordering_key, r->>10 AS broker_message_id, (r->>11)::int AS receive_count,
           r->>12 AS trace_context, (r->>13)::int AS priority, t.ord,
           nextval('work_item_seq') AS seq, (r->>14)::float8 AS lease_seconds,
           coalesce(%(now)s::timestamptz, now()) AS at
      FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS t(r, ord)
     ORDER BY t.ord
),
taking AS (
    SELECT input.*,
           input.lease_seconds IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM rate_wait r
                            WHERE r.job_type = input.job_type AND r.tenant_id = input.tenant_id
                              AND r.until > input.at) AS taken
      FROM input
),
inserted AS (
    INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                           schema_version, payload_hash, payload_ref, max_attempts, seq,
                           ordering_key, broker_message_id, receive_count, trace_context,
                           next_attempt_at, created_at, updated_at, identity_key_id, priority,
                           claim_order, state, fence, attempts, lease_owner, lease_expires_at,
                           claimed_at)
    SELECT tenant_id, operation_id, subscription, job_type, target_class,
           schema_version, payload_hash, payload_ref, max_attempts, seq,
           ordering_key, broker_message_id, receive_count, trace_context,
           at, at, at,
           coalesce(%(identity_key_id)s::smallint,
                    (SELECT max(k.key_id) FROM identity_key k), 1),
           priority, at - make_interval(secs => priority * %(aging)s::float8),
           CASE WHEN taken THEN 'claimed' ELSE 'queued' END,
           CASE WHEN taken THEN fencebridge_next_fence(0) ELSE 0 END, taken::int,
           CASE WHEN taken THEN %(worker)s::text END,
           CASE WHEN taken THEN at + make_interval(secs => lease_seconds) END,
           CASE WHEN taken THEN at END
      FROM taking
     ORDER BY tenant_id, operation_id
        ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id, payload_ref, lease_expires_at, identity_key_id, fence
),
stored AS (
    INSERT INTO payload (payload_ref, tenant_id, body)
    SELECT i.payload_ref, i.tenant_id, input.body
      FROM inserted i
      JOIN input USING (tenant_id, operation_id)
)
