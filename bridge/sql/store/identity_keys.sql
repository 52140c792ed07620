-- Every recorded identity key, oldest first; the newest is the current one. missed_erasure_at
-- (migration 0024): when an erasure first left its tombstones under other keys only.
SELECT key_id, fingerprint, registered_at, registered_by, reason, missed_erasure_at
  FROM identity_key
 ORDER BY key_id
