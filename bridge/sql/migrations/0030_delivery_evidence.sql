-- Delivery evidence per operation: how many copies of its delivery arrived after the first
-- (replays: the same payload again) and when the last one did. The first copy's arrival is the
-- row's created_at; conflicting copies are in rejected_delivery. Written by the inbox when a
-- batch holds a replay, read by `fencebridge inspect` and the console's operation page. Two
-- columns of the row, so an erasure or a purge removes them with it. Adding a column with a
-- constant default rewrites nothing.
ALTER TABLE work_item
    ADD COLUMN replays        integer     NOT NULL DEFAULT 0,
    ADD COLUMN last_replay_at timestamptz;
