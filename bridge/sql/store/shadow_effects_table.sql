-- The existing system's effect log kept in this database (a table or view named by the
-- operator, quoted as an identifier): each row as JSON, so its optional payload_hash column may
-- be absent. Columns: tenant, operation, applied_at, payload_hash (optional, hex sha256). In
-- key order, byte order ("C") as shadow_operations.sql, for the report's merge; read through a
-- cursor held across pages.
SELECT to_jsonb(e)
  FROM {effects} AS e
 ORDER BY (to_jsonb(e) ->> 'tenant') COLLATE "C", (to_jsonb(e) ->> 'operation') COLLATE "C"
