-- An index an interrupted CREATE INDEX CONCURRENTLY left behind: present, but invalid (never
-- used for reads, still written to). IF NOT EXISTS would take it for built.
SELECT c.relname
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema()
   AND c.relname = %(name)s
   AND NOT i.indisvalid
