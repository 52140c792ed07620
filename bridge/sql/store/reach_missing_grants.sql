-- The (table, privilege) pairs of the list the current role does not hold. A table the schema
-- does not have is skipped (the version check before this one answers for the schema).
SELECT g.tbl, g.privilege
  FROM unnest(%(tables)s::text[], %(privileges)s::text[]) AS g (tbl, privilege)
 WHERE to_regclass(g.tbl) IS NOT NULL
   AND NOT has_table_privilege(to_regclass(g.tbl), g.privilege)
 ORDER BY g.tbl, g.privilege
