-- Record the first key a process brings to this database as key 1, the key of every row
-- written before keys were recorded. Only while no key is recorded; of two first uses at once
-- the primary key decides, and the other inserts nothing and compares with the winner.
INSERT INTO identity_key (key_id, fingerprint, registered_by, reason)
SELECT 1, %(fingerprint)s, %(registered_by)s, %(reason)s
 WHERE NOT EXISTS (SELECT 1 FROM identity_key)
    ON CONFLICT DO NOTHING
RETURNING key_id
