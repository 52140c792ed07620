-- Parked outbox messages back to the relay (`fencebridge resend`), oldest parked first, with
-- their ids unchanged: a consumer that has one already drops the copy. A message moved has no
-- failed send counted any more (so max_attempts again) and keeps its last error. The same
-- statement audits each move in outbox_audit with the attempts and park reason it had. Guarded
-- inside the write: a message no longer parked (another resend) is left alone.
WITH picked AS (
    SELECT message_id, destination, attempts, park_reason, seq
      FROM outbox_message
     WHERE state = 'parked'
       AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
       AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
       AND (%(operation_id)s::text IS NULL OR operation_id = %(operation_id)s::text)
       AND (%(message_ids)s::text[] IS NULL OR message_id = ANY (%(message_ids)s::text[]))
     ORDER BY parked_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE outbox_message m
       SET state = 'pending', attempts = 0, park_reason = NULL, parked_at = NULL
      FROM picked p
     WHERE m.message_id = p.message_id
       AND m.state = 'parked'
    RETURNING m.message_id, m.destination, p.attempts, p.park_reason, p.seq
),
audited AS (
    INSERT INTO outbox_audit (actor, reason, message_id, destination, from_state, to_state,
                              attempts, park_reason)
    SELECT %(actor)s, %(reason)s, message_id, destination, 'parked', 'pending', attempts,
           park_reason
      FROM moved
)
SELECT message_id, destination, attempts, park_reason FROM moved ORDER BY seq
