-- The schema migrate would create its tables in, when the current role may not create there
-- (none when it may).
SELECT coalesce(current_schema(), '(no schema on the search_path)')
 WHERE current_schema() IS NULL OR NOT has_schema_privilege(current_schema(), 'CREATE')
