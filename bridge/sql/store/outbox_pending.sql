-- A destination's next pending messages, in the order they were written: at most %(limit)s,
-- and no more once %(max_bytes)s of bodies are read (the first message always, however large),
-- so a round's memory stays bounded when messages are large (Pub/Sub takes 10 MB). The sizes
-- are read from the stored values' headers; only the bodies returned are fetched.
SELECT message_id, tenant_id, operation_id, body, attributes, ordering_key, trace_context,
       attempts
  FROM (SELECT message_id, tenant_id, operation_id, body, attributes, ordering_key,
               trace_context, attempts, seq,
               sum(octet_length(body)) OVER (ORDER BY seq) - octet_length(body) AS before
          FROM outbox_message
         WHERE destination = %(destination)s AND state = 'pending'
         ORDER BY seq
         LIMIT %(limit)s) AS next
 WHERE before < %(max_bytes)s
 ORDER BY seq
