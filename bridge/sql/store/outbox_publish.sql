-- A class A handler's message, in its fenced transaction (the work row is locked by this
-- transaction under the fence, so only the current claim can get here). The id is deterministic:
-- a conflict is the same message written again, never a second one.
INSERT INTO outbox_message (message_id, tenant_id, operation_id, fence, destination, body,
                            attributes, ordering_key, trace_context)
VALUES (%(message_id)s, %(tenant_id)s, %(operation_id)s, %(fence)s, %(destination)s, %(body)s,
        %(attributes)s, %(ordering_key)s, %(trace_context)s)
ON CONFLICT (message_id) DO NOTHING
