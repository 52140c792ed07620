-- Prioritised claiming: the order claims take due rows in becomes a column of its own
-- (claim_order), apart from the moment a row becomes due (next_attempt_at). A row's claim order
-- is its due time moved earlier by its priority times the configured aging: a higher priority
-- overtakes lower ones by that much time and no more, so a low-priority row, waiting, is
-- claimed once newer rows no longer overtake it. Written with the row, and again whenever its
-- due time changes (retry, release, rate limit, redrive).
--
-- Expand only: two columns with defaults that need no rewrite (now() is read once, at this
-- statement, for the rows already there, which keep their ingest order through seq; a row
-- written afterwards by the earlier release takes the moment it was written), read only by this
-- release. Their indexes come in 0013, concurrently.
ALTER TABLE work_item
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN claim_order timestamptz NOT NULL DEFAULT now();
