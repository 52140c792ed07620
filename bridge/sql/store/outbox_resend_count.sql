-- How many parked outbox messages a resend with this selection would consider right now.
SELECT count(*)
  FROM outbox_message
 WHERE state = 'parked'
   AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
   AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
   AND (%(operation_id)s::text IS NULL OR operation_id = %(operation_id)s::text)
   AND (%(message_ids)s::text[] IS NULL OR message_id = ANY (%(message_ids)s::text[]))
