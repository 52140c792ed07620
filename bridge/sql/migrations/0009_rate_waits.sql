-- Rate limits that follow the target: when a handler answers RateLimited (an HTTP 429, a quota),
-- every row of the same job type and tenant waits until the target's Retry-After has passed, not
-- only the row that was refused. One row per (job_type, tenant_id) that was limited; claim and
-- claim_keys skip a key whose wait is still ahead (a probe on the primary key).
--
-- Written by rate_limited.sql only, which keeps the later of the existing and the new wait and
-- deletes the tenant's waits that have passed (lazily: nothing else has to run for the table to
-- stay small; it holds at most one row per job type and tenant ever limited). Erasing a tenant
-- deletes its waits (below).
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

-- A wait names its tenant, so erasing the tenant removes its waits too: the erasure function of
-- 0002, replaced with one more DELETE (same signature and result; ownership and grants stay,
-- the pinned search_path is set again since a replacement resets it).
CREATE OR REPLACE FUNCTION fencebridge_erase_tenant(
    p_tenant_id text,
    p_tenant_hash text,
    p_actor text,
    p_reason text
) RETURNS TABLE (work_rows integer, payloads integer, rejected_deliveries integer,
                 redrive_audits integer)
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    refs text[];
BEGIN
    IF coalesce(p_tenant_id, '') = '' THEN
        RAISE EXCEPTION 'an erasure needs a tenant id' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(array_agg(payload_ref), '{}') INTO refs
      FROM (SELECT w.payload_ref FROM work_item w WHERE w.tenant_id = p_tenant_id
            UNION
            SELECT r.payload_ref FROM rejected_delivery r
             WHERE r.tenant_id = p_tenant_id AND r.payload_ref IS NOT NULL) AS owned;

    DELETE FROM work_item w WHERE w.tenant_id = p_tenant_id;
    GET DIAGNOSTICS work_rows = ROW_COUNT;
    DELETE FROM rejected_delivery r WHERE r.tenant_id = p_tenant_id;
    GET DIAGNOSTICS rejected_deliveries = ROW_COUNT;
    DELETE FROM payload p WHERE p.tenant_id = p_tenant_id OR p.payload_ref = ANY (refs);
    GET DIAGNOSTICS payloads = ROW_COUNT;
    DELETE FROM redrive_audit a WHERE a.tenant_id = p_tenant_id;
    GET DIAGNOSTICS redrive_audits = ROW_COUNT;
    DELETE FROM rate_wait q WHERE q.tenant_id = p_tenant_id;

    INSERT INTO erasure_audit (actor, reason, tenant_hash, work_rows, payloads,
                               rejected_deliveries, redrive_audits)
    VALUES (p_actor, p_reason, p_tenant_hash, work_rows, payloads, rejected_deliveries,
            redrive_audits);
    RETURN NEXT;
END
$$;

DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION fencebridge_erase_tenant(text, text, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$pin$;
