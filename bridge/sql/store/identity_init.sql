-- `fencebridge identity init`: record the deployment's key as key 1, with who and why, only
-- while no key is recorded (of two at once, the primary key decides).
INSERT INTO identity_key (key_id, fingerprint, registered_by, reason)
SELECT 1, %(fingerprint)s, %(actor)s, %(reason)s
 WHERE NOT EXISTS (SELECT 1 FROM identity_key)
    ON CONFLICT DO NOTHING
RETURNING key_id
