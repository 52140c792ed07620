-- Rotate: the new key becomes the newest, hence current, key, but only while the key the
-- rotation was decided against is still the newest. A concurrent rotation takes the same key
-- id first (primary key), and this one inserts nothing.
INSERT INTO identity_key (key_id, fingerprint, registered_by, reason)
SELECT %(current_id)s + 1, %(fingerprint)s, %(actor)s, %(reason)s
 WHERE (SELECT max(key_id) FROM identity_key) = %(current_id)s
    ON CONFLICT DO NOTHING
RETURNING key_id
