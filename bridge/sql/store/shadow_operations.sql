-- The operations shadow subscriptions recorded, one per operation with the payload hash it was
-- first seen with (by the subscription that saw it first), in key order for the report's merge
-- with the effect log: byte order ("C"), which is the code point order the report sorts a file
-- in, whatever the database's own collation. Read through a cursor held across pages.
SELECT DISTINCT ON (tenant_id COLLATE "C", operation_id COLLATE "C")
       tenant_id, operation_id, job_type, payload_hash
  FROM shadow_operation
 WHERE subscription = ANY (%(subscription)s::text[])
 ORDER BY tenant_id COLLATE "C", operation_id COLLATE "C", first_seen_at, subscription
