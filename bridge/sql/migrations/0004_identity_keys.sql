-- Identity keys: which secret (FENCEBRIDGE_IDENTITY_KEY) each work row was written under.
--
-- A provider deduplicates a class C operation by the idempotency key derived from this secret,
-- so a process with another secret would look up and send under other keys, and a charge the
-- provider applied would look "not applied". The database records each secret by its
-- fingerprint (an HMAC of a constant under the secret, never the secret); every process
-- compares its key with the recorded one before it hashes anything. The newest key is the
-- current one: new rows are written under it. A rotation adds a key; earlier keys stay for the
-- rows written under them.

CREATE TABLE identity_key (
    key_id        smallint    PRIMARY KEY CHECK (key_id > 0),
    fingerprint   text        NOT NULL UNIQUE CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- the first use (the command that recorded it) or the operator who rotated it in
    registered_by text        NOT NULL CHECK (registered_by <> ''),
    reason        text
);

-- Rows written before this migration, and by a release that does not know the column, were
-- written under the deployment's one key: key 1, the first key a process records. A constant
-- default: no table rewrite.
ALTER TABLE work_item ADD COLUMN identity_key_id smallint NOT NULL DEFAULT 1;
