-- The key of the work row with this seq (the console's handle of a listed row).
SELECT tenant_id, operation_id FROM work_item WHERE seq = %(seq)s
