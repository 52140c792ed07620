-- Rate limits that follow the target: when a handler answers RateLimited (an HTTP 429, a quota),
-- every row of the same job type and tenant waits until the target's Retry-After has passed, not
-- only the row that was refused. One row per (job_type, tenant_id) that was limited; claim and
-- claim_keys skip a key whose wait is still ahead (a probe on the primary key).
--
-- Written by rate_limited.sql only, which keeps the later of the existing and the new wait and
-- deletes the tenant's waits that have passed (lazily: nothing else has to run for the table to
-- stay small; it holds at most one row per job type and tenant ever limited).
--
-- A new table: nothing existing is rewritten or locked. The running release does not know it
-- and ignores waits, which only means it claims limited keys earlier, as it always did.
CREATE TABLE rate_wait (
    job_type  text        NOT NULL,
    tenant_id text        NOT NULL,
    until     timestamptz NOT NULL,
    PRIMARY KEY (job_type, tenant_id)
);

ALTER TABLE rate_wait ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON rate_wait
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));
