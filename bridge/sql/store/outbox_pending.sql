-- A destination's next pending messages, in the order they were written.
SELECT message_id, tenant_id, operation_id, body, attributes, ordering_key, trace_context,
       attempts
  FROM outbox_message
 WHERE destination = %(destination)s AND state = 'pending'
 ORDER BY seq
 LIMIT %(limit)s
