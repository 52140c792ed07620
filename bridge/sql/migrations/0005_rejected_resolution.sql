-- A rejected delivery a person has dealt with: `fencebridge resolve` records who closed it, when
-- and why, on the delivery itself, as a redrive does. Resolving never touches the work row: a
-- conflict's operation keeps the payload it was first written with.
--
-- Nullable columns without a default: no table rewrite, and the running release, which does not
-- know them, still reads and writes the table unchanged (it counts a resolved delivery as open
-- until it is replaced).
ALTER TABLE rejected_delivery
    ADD COLUMN resolved_at       timestamptz,
    ADD COLUMN resolved_by       text,
    ADD COLUMN resolution_reason text;

-- Either all three or none; NOT VALID: existing rows have none, and nothing is scanned under the
-- lock (see docs/migrations.md: a later migration may validate it).
ALTER TABLE rejected_delivery
    ADD CONSTRAINT rejected_delivery_resolution_audited
    CHECK ((resolved_at IS NULL AND resolved_by IS NULL AND resolution_reason IS NULL)
           OR (resolved_at IS NOT NULL AND coalesce(resolved_by, '') <> ''
               AND coalesce(resolution_reason, '') <> ''))
    NOT VALID;
