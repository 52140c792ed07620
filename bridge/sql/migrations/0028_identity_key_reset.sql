-- The record of identity key resets: `fencebridge identity reset` replaces a key that nothing
-- was written under (no work row, intent, rejected delivery, tombstone, shadow record or outbox
-- message) with the environment's key, for a first setup that recorded a throwaway key. The
-- replaced key's fingerprint (never the key), when and by whom it was recorded, and who reset
-- it and why, written in the statement that replaces it (identity_reset.sql).
--
-- A new table only: nothing existing is rewritten or locked, and the running release ignores it.
CREATE TABLE identity_key_reset (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                    timestamptz NOT NULL DEFAULT now(),
    actor                 text        NOT NULL CHECK (actor <> ''),
    reason                text        NOT NULL CHECK (reason <> ''),
    key_id                smallint    NOT NULL,
    replaced_fingerprint  text        NOT NULL,
    replaced_recorded_at  timestamptz NOT NULL,
    replaced_recorded_by  text        NOT NULL,
    fingerprint           text        NOT NULL
);
