-- Write one batch of deliveries in one statement (the inbox's one round trip): the new
-- operations inserted as parts/ingest_insert_rows.sql inserts them (%(rows)s: the first
-- delivery of each key), and the deliveries of keys that existed decided here as the careful
-- way decides them: a replay (the stored payload hash) recorded in delivery_copy, a conflict
-- (another hash) recorded in rejected_delivery with its hash only. %(copies)s (JSON, null when
-- none) holds the batch's later deliveries of a key it holds already, each as [the 1-based
-- place of its key's first in %(rows)s, its payload hash in hex, subscription, broker message
-- id, job type]: decided against the row the batch inserted or the stored one. Returns one row
-- per key: an inserted row's lease (where it was written claimed), identity key and fence; a
-- stored row's payload hash and state.
--
-- A key that existed is read in the statement's snapshot (found): a row committed before it
-- began. The check, once every row is in, is fencebridge_expect_new_batch (migrations 0023,
-- 0024), given the count of keys decided (inserted, or found) for its count of keys inserted:
-- it refuses (FBNEW) unless every one of the batch's %(expected)s keys was decided and none of
-- them has a tombstone, looked up by keyed hash (%(key_id)s, %(operation_hash)s: one entry per
-- key and identity key held; with none to look up by, %(any_erased)s: any tombstone refuses),
-- and refuses first (FBKEY) a process whose every key an erasure missed. A key neither
-- inserted nor found was inserted by a writer that committed after the snapshot (the insert
-- waited for it): the careful way reads it in a snapshot of its own.
--
-- One statement, its own transaction (the connection is autocommit): a refusal fails it and
-- nothing of it commits; the inbox then writes the batch the careful way. The check is a
-- one-time filter over counts (no table is read for them), so it runs once, after the insert
-- and before any row is returned, in a function of its own: its lookup takes a snapshot after
-- the insert's, and sees the tombstone of an erasure that deleted a row while the insert waited
-- on it. A found row is locked FOR KEY SHARE before its replays are appended, in key order; one
-- erased or purged since the snapshot is skipped, as ingest_replays.sql does. Each row is read
-- by its key, one lookup each (a lateral subquery): a join, planned once on a new database's
-- empty tables, read the whole primary key at every batch. A replay of a row
-- this statement inserted references it directly (the foreign key is checked at the end of the
-- statement, when the row is in).
--
-- Before, a batch that held a key that existed was refused here and written the careful way
-- (three round trips and a lookup more); at 10% of deliveries re-sent, most batches of 10 hold
-- one (docs/benchmarks.md, "Inbox to settle, end to end").
\i ingest_insert_rows
,
keyed AS (
    SELECT i.ord, i.tenant_id, i.operation_id, i.payload_hash AS sent, n.fence IS NOT NULL AS fresh,
           n.lease_expires_at, n.identity_key_id, n.fence, w.payload_hash, w.state
      FROM input i
      LEFT JOIN inserted n USING (tenant_id, operation_id)
      LEFT JOIN LATERAL (SELECT payload_hash, state FROM work_item
                          WHERE n.fence IS NULL AND tenant_id = i.tenant_id
                            AND operation_id = i.operation_id OFFSET 0) w ON true
),
decided AS (
    SELECT k.tenant_id, k.operation_id, k.fresh, a.*,
           a.payload_hash = coalesce(k.payload_hash, k.sent) AS same
      FROM (SELECT ord, payload_hash, subscription, broker_message_id, job_type, true AS first
              FROM input
             UNION ALL
            SELECT (c->>0)::bigint, decode(c->>1, 'hex'), c->>2, c->>3, c->>4, false
              FROM jsonb_array_elements(%(copies)s::jsonb) c) a
      JOIN keyed k USING (ord)
),
locked AS (
    SELECT w.*
      FROM (SELECT * FROM decided WHERE same AND NOT fresh ORDER BY 1, 2) d,
           LATERAL (SELECT tenant_id, operation_id FROM work_item
                     WHERE (tenant_id, operation_id) = (d.tenant_id, d.operation_id)
                       FOR KEY SHARE) w
),
copied AS (
    INSERT INTO delivery_copy (tenant_id, operation_id, arrived_at)
    SELECT tenant_id, operation_id, coalesce(%(now)s::timestamptz, now())
      FROM (SELECT * FROM locked
             UNION ALL
            SELECT tenant_id, operation_id FROM decided WHERE same AND fresh AND NOT first) c
),
rejected AS (
    INSERT INTO rejected_delivery (kind, reason, subscription, broker_message_id, tenant_id,
                                   operation_id, job_type, payload_hash)
    SELECT 'conflict', %(conflict)s, subscription, broker_message_id, tenant_id, operation_id,
           job_type, payload_hash
      FROM decided
     WHERE NOT same
     ORDER BY ord
)
SELECT tenant_id, operation_id, lease_expires_at, identity_key_id, fence, payload_hash, state
  FROM keyed
 WHERE (SELECT fencebridge_expect_new_batch(
               (SELECT count(fence) + count(state) FROM keyed), %(expected)s::bigint,
               %(key_id)s::smallint[], %(operation_hash)s::bytea[], %(any_erased)s::boolean))
