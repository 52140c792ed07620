-- Who sent parked outbox messages back to the relay, and why: `fencebridge resend` writes one
-- row per message it moves, in the statement that moves it (outbox_resend.sql), as redrive
-- does for work rows in redrive_audit.
--
-- No raw tenant or operation identifier: a message is named by its id, which is derived from
-- the operation's opaque idempotency key, and by its destination. So an erasure has nothing
-- here to remove (like its tombstones and its own audit), and the table needs no row-level
-- security; `fencebridge inspect` finds an operation's resends through its messages' ids.
--
-- A new table only: nothing existing is rewritten or locked, and the running release ignores
-- it. Its index is built in 0027, concurrently.
CREATE TABLE outbox_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL CHECK (actor <> ''),
    reason      text        NOT NULL CHECK (reason <> ''),
    message_id  text        NOT NULL,
    destination text        NOT NULL,
    from_state  text        NOT NULL,
    to_state    text        NOT NULL,
    -- the failed sends it had, and why it was parked, when it was moved
    attempts    integer     NOT NULL,
    park_reason text
);
