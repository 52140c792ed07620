-- The key a rejected delivery was recorded under (the console's handle of a listed delivery);
-- none for an undecodable delivery without one.
SELECT tenant_id, operation_id
  FROM rejected_delivery
 WHERE id = %(id)s
   AND tenant_id IS NOT NULL
   AND operation_id IS NOT NULL
