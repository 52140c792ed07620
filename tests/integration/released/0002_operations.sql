-- Operator commands: retention (purge), erasure of a tenant, and the record of both.

-- Purge finds terminal rows by age without scanning the table. Only succeeded and failed rows
-- are in it, so a claim (queued -> claimed) never writes to it; a settlement into a terminal
-- state adds one entry.
CREATE INDEX work_item_terminal ON work_item (settled_at)
    WHERE state IN ('succeeded', 'failed_terminal');

-- A redriven rejected delivery carries its own audit: who, why and what the inbox made of it.
ALTER TABLE rejected_delivery
    ADD COLUMN redriven_by     text,
    ADD COLUMN redrive_reason  text,
    ADD COLUMN redrive_outcome text
        CHECK (redrive_outcome IN ('new', 'replay', 'conflict'));

-- One row per erasure of a tenant. It names the tenant only by a keyed hash: the record that
-- an erasure happened must not itself keep the identifier that was erased.
CREATE TABLE erasure_audit (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                  timestamptz NOT NULL DEFAULT now(),
    actor               text        NOT NULL CHECK (actor <> ''),
    reason              text        NOT NULL CHECK (reason <> ''),
    tenant_hash         text        NOT NULL CHECK (tenant_hash <> ''),
    work_rows           integer     NOT NULL,
    payloads            integer     NOT NULL,
    rejected_deliveries integer     NOT NULL,
    redrive_audits      integer     NOT NULL
);

-- Erase one tenant: its work rows, the payloads they and its rejected deliveries point to, its
-- rejected deliveries and its redrive audit, and record the erasure, in one transaction.
--
-- SECURITY DEFINER: the redrive audit is append-only for the running bridge (no DELETE grant;
-- see infra/postgres/roles.sql), and this function is the one way to remove audit rows, which
-- always leaves an erasure record behind. The search path is pinned below (pg_temp last), so a
-- caller cannot substitute its own tables.
CREATE FUNCTION fencebridge_erase_tenant(
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

REVOKE ALL ON FUNCTION fencebridge_erase_tenant(text, text, text, text) FROM PUBLIC;
