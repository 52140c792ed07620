-- Replace the one recorded key (nothing written under it: identity_reset_written.sql, under the
-- lock of identity_reset_lock.sql) with the environment's, and record the reset in the same
-- statement.
WITH replaced AS (
    DELETE FROM identity_key
     WHERE key_id = %(key_id)s AND fingerprint = %(replaced)s
 RETURNING key_id, fingerprint, registered_at, registered_by
), recorded AS (
    INSERT INTO identity_key (key_id, fingerprint, registered_by, reason)
    SELECT key_id, %(fingerprint)s, %(actor)s, %(reason)s FROM replaced
 RETURNING key_id
)
INSERT INTO identity_key_reset
       (actor, reason, key_id, replaced_fingerprint, replaced_recorded_at, replaced_recorded_by,
        fingerprint)
SELECT %(actor)s, %(reason)s, r.key_id, r.fingerprint, r.registered_at, r.registered_by,
       %(fingerprint)s
  FROM replaced r JOIN recorded USING (key_id)
RETURNING id
