-- What `fencebridge check` reads from the catalog: the schema facts the go/no-go controls rest
-- on. Every lookup goes through to_regclass / to_regprocedure, so an unmigrated database
-- answers with NULLs instead of an error.
WITH w AS (SELECT to_regclass('work_item') AS oid)
SELECT
    (SELECT array_agg(a.attname::text ORDER BY k.ord)
       FROM w
       JOIN pg_constraint c ON c.conrelid = w.oid AND c.contype = 'p'
       CROSS JOIN unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
       JOIN pg_attribute a ON a.attrelid = w.oid AND a.attnum = k.attnum) AS primary_key,
    (SELECT a.attnotnull
       FROM w JOIN pg_attribute a ON a.attrelid = w.oid
      WHERE a.attname = 'payload_hash' AND NOT a.attisdropped) AS payload_hash_not_null,
    (SELECT bool_or(pg_get_constraintdef(c.oid) LIKE '%octet_length(payload_hash) = 32%')
       FROM w JOIN pg_constraint c ON c.conrelid = w.oid AND c.contype = 'c')
        AS payload_hash_is_sha256,
    (SELECT bool_or(t.tgenabled <> 'D')
       FROM w JOIN pg_trigger t ON t.tgrelid = w.oid
      WHERE t.tgname = 'work_item_identity_immutable') AS identity_immutable,
    (SELECT pg_get_expr(i.indpred, i.indrelid)
       FROM w JOIN pg_index i ON i.indrelid = w.oid
      WHERE i.indexrelid = to_regclass('work_item_due')) AS claim_index_predicate,
    (SELECT format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL'
                                                         ELSE '' END
       FROM w JOIN pg_attribute a ON a.attrelid = w.oid
      WHERE a.attname = 'fence' AND NOT a.attisdropped) AS fence_column,
    (SELECT string_agg(pg_get_constraintdef(c.oid), ' ')
       FROM w JOIN pg_constraint c ON c.conrelid = w.oid AND c.contype = 'c'
      WHERE pg_get_constraintdef(c.oid) LIKE '%state%' AND pg_get_constraintdef(c.oid) LIKE '%queued%')
        AS state_check,
    (SELECT array_agg(c.relname::text ORDER BY c.relname)
       FROM pg_class c
      WHERE c.oid IN (to_regclass('work_item'), to_regclass('payload'),
                      to_regclass('rejected_delivery'), to_regclass('redrive_audit'))
        AND c.relrowsecurity) AS row_security,
    (SELECT count(*)
       FROM w JOIN pg_attribute a ON a.attrelid = w.oid
      WHERE a.attname = 'body' AND NOT a.attisdropped) = 0 AS work_item_without_body,
    to_regclass('payload') IS NOT NULL AS payload_table,
    to_regclass('erasure_audit') IS NOT NULL AS erasure_audit,
    -- the erasure that keeps a tombstone per operation under every identity key held, and
    -- refuses while an outbox message in scope is unsent (migration 0024)
    (to_regprocedure('fencebridge_erase_under_keys(text, text, text, text, smallint[], text[], '
                     'bytea[], text, text, boolean)') IS NOT NULL
     AND to_regclass('erased_operation') IS NOT NULL) AS erasure_function
