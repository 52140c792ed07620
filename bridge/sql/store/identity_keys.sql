-- Every recorded identity key, oldest first; the newest is the current one.
SELECT key_id, fingerprint, registered_at, registered_by, reason
  FROM identity_key
 ORDER BY key_id
