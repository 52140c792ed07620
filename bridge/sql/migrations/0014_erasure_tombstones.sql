-- Erasure that keeps dedupe: an erased operation leaves a tombstone, so a delivery of it that the
-- broker still holds (SQS keeps messages up to 14 days, Pub/Sub up to 31) is a replay or a
-- conflict, never new work.
--
-- A tombstone holds no identifier and no payload: the operation by a keyed hash (HMAC-SHA256
-- under the identity key `key_id`, computed by the process, never by the database, which never
-- sees the key), the tenant by its short keyed hash (the one erasure_audit and the logs use),
-- the approved payload's sha256, the state and outcome code the row had, and when it was
-- erased. `fencebridge purge` removes tombstones past [retention] tombstone_days.
--
-- Expand only: new tables, two nullable columns on erasure_audit and a new function. The
-- running release knows none of them: its inbox does not consult tombstones, so erasures are
-- run with this release's `fencebridge erase` once its bridges run (docs/operations.md).
CREATE TABLE erased_operation (
    key_id         smallint    NOT NULL,
    operation_hash bytea       NOT NULL CHECK (octet_length(operation_hash) = 32),
    tenant_hash    text        NOT NULL CHECK (tenant_hash <> ''),
    payload_hash   bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
    state          text        NOT NULL
        CHECK (state IN ('succeeded', 'failed_terminal', 'unknown', 'quarantined')),
    outcome_code   text,
    erased_at      timestamptz NOT NULL DEFAULT now(),
    erasure_id     bigint      NOT NULL,
    PRIMARY KEY (key_id, operation_hash)
);
-- (purge reads the oldest tombstones first: their index comes in 0015, built concurrently)

-- No tenant column to scope a tenant role by: tenant roles see none (RLS on, no policy); the
-- bridge and the operator bypass row security.
ALTER TABLE erased_operation ENABLE ROW LEVEL SECURITY;

-- Shadow subscriptions ([subscriptions.<name>] mode = "shadow"): a copy of the stream decoded
-- and decided as the inbox decides it (new, replay, conflict, quarantined), written apart from
-- work_item, so that nothing can ever claim it: the claims read work_item only. One row per
-- operation a shadow subscription saw (its first payload hash), one per delivery with what the
-- inbox would have made of it. No payload is kept: only hashes. Read by `fencebridge shadow
-- report`; erasure reaches both tables; their indexes come in 0015.
CREATE TABLE shadow_operation (
    subscription  text        NOT NULL,
    tenant_id     text        NOT NULL CHECK (tenant_id <> ''),
    operation_id  text        NOT NULL CHECK (operation_id <> ''),
    job_type      text        NOT NULL,
    payload_hash  bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, operation_id, subscription)
);
CREATE TABLE shadow_delivery (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription      text        NOT NULL,
    decision          text        NOT NULL
        CHECK (decision IN ('new', 'replay', 'conflict', 'quarantined')),
    -- what the rules could read; an undecodable delivery may have none of them
    tenant_id         text,
    operation_id      text,
    job_type          text,
    payload_hash      bytea,
    -- why a delivery would have been quarantined
    reason            text,
    broker_message_id text,
    received_at       timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE shadow_operation ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON shadow_operation
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));
ALTER TABLE shadow_delivery ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON shadow_delivery
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

-- An erasure of one operation (erase --operation) names it by its keyed hash; both kinds count
-- the tombstones they left.
ALTER TABLE erasure_audit
    ADD COLUMN operation_hash text,
    ADD COLUMN tombstones     integer;

-- Erase one tenant, or one operation of it (p_operation_id not null), keeping a tombstone per
-- operation, in one transaction:
--
-- * the rows in scope are locked first; a queued or claimed row refuses the whole erasure (an
--   attempt may be acting, or the operation has yet to run: erase once it has settled or been
--   parked), as does a row whose keyed hash the caller did not pass (written meanwhile: retry);
-- * one tombstone per row: its keyed hash (from p_operation_ids/p_operation_hashes, computed by
--   the caller under identity key p_key_id), payload hash, state, outcome code;
-- * then, as fencebridge_erase_tenant does for a tenant: the rows (attempt history cascades),
--   their payloads, the rejected deliveries (bodies included) and redrive audit of the scope,
--   and for a whole tenant its rate waits; what shadow subscriptions recorded of the scope; the
--   erasure recorded by hashes only.
--
-- SECURITY DEFINER, search path pinned, like fencebridge_erase_tenant (0002): the one way to
-- write tombstones and remove audit rows, and it always leaves an erasure record.
CREATE FUNCTION fencebridge_erase(
    p_tenant_id text,
    p_operation_id text,
    p_tenant_hash text,
    p_operation_hash text,
    p_key_id smallint,
    p_operation_ids text[],
    p_operation_hashes bytea[],
    p_actor text,
    p_reason text
) RETURNS TABLE (work_rows integer, payloads integer, rejected_deliveries integer,
                 redrive_audits integer, tombstones integer)
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    refs text[];
    open_rows integer;
    unhashed integer;
    erasure bigint;
BEGIN
    IF coalesce(p_tenant_id, '') = '' OR coalesce(p_tenant_hash, '') = '' OR p_key_id IS NULL THEN
        RAISE EXCEPTION 'an erasure needs a tenant id, its hash and the identity key id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_operation_id = '' OR (p_operation_id IS NULL) <> (p_operation_hash IS NULL) THEN
        RAISE EXCEPTION 'an erasure of one operation needs its id and its hash'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(cardinality(p_operation_ids), 0) <> coalesce(cardinality(p_operation_hashes), 0)
    THEN
        RAISE EXCEPTION 'one keyed hash per operation id' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM 1 FROM work_item w
      WHERE w.tenant_id = p_tenant_id
        AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)
      FOR UPDATE;
    SELECT count(*) FILTER (WHERE w.state IN ('queued', 'claimed')),
           count(*) FILTER (WHERE w.operation_id <> ALL (coalesce(p_operation_ids, '{}')))
      INTO open_rows, unhashed
      FROM work_item w
     WHERE w.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR w.operation_id = p_operation_id);
    IF open_rows > 0 THEN
        RAISE EXCEPTION 'erasure refused: % operation(s) in scope are queued or claimed', open_rows
            USING ERRCODE = 'object_in_use',
                  HINT = 'erase once they have settled or been parked; nothing was erased';
    END IF;
    IF unhashed > 0 THEN
        RAISE EXCEPTION 'erasure refused: % operation(s) were written after their hashes were computed', unhashed
            USING ERRCODE = 'serialization_failure', HINT = 'run the erasure again';
    END IF;

    SELECT coalesce(array_agg(payload_ref), '{}') INTO refs
      FROM (SELECT w.payload_ref FROM work_item w
             WHERE w.tenant_id = p_tenant_id
               AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)
            UNION
            SELECT r.payload_ref FROM rejected_delivery r
             WHERE r.tenant_id = p_tenant_id
               AND (p_operation_id IS NULL OR r.operation_id = p_operation_id)
               AND r.payload_ref IS NOT NULL) AS owned;

    INSERT INTO erasure_audit (actor, reason, tenant_hash, operation_hash, work_rows, payloads,
                               rejected_deliveries, redrive_audits, tombstones)
    VALUES (p_actor, p_reason, p_tenant_hash, p_operation_hash, 0, 0, 0, 0, 0)
    RETURNING id INTO erasure;

    -- A tombstone already there (an operation erased, written again by a release that ignored
    -- tombstones, and erased again) keeps its first record.
    INSERT INTO erased_operation (key_id, operation_hash, tenant_hash, payload_hash, state,
                                  outcome_code, erasure_id)
    SELECT p_key_id, h.operation_hash, p_tenant_hash, w.payload_hash, w.state, w.outcome_code,
           erasure
      FROM work_item w
      JOIN unnest(p_operation_ids, p_operation_hashes) AS h(operation_id, operation_hash)
        ON h.operation_id = w.operation_id
     WHERE w.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)
        ON CONFLICT (key_id, operation_hash) DO NOTHING;
    GET DIAGNOSTICS tombstones = ROW_COUNT;

    DELETE FROM work_item w
     WHERE w.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR w.operation_id = p_operation_id);
    GET DIAGNOSTICS work_rows = ROW_COUNT;
    DELETE FROM rejected_delivery r
     WHERE r.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR r.operation_id = p_operation_id);
    GET DIAGNOSTICS rejected_deliveries = ROW_COUNT;
    DELETE FROM payload p
     WHERE p.payload_ref = ANY (refs)
        OR (p_operation_id IS NULL AND p.tenant_id = p_tenant_id);
    GET DIAGNOSTICS payloads = ROW_COUNT;
    DELETE FROM redrive_audit a
     WHERE a.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR a.operation_id = p_operation_id);
    GET DIAGNOSTICS redrive_audits = ROW_COUNT;
    IF p_operation_id IS NULL THEN
        DELETE FROM rate_wait q WHERE q.tenant_id = p_tenant_id;
    END IF;
    -- what shadow subscriptions recorded of the scope (identifiers and hashes, no payload)
    DELETE FROM shadow_operation s
     WHERE s.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR s.operation_id = p_operation_id);
    DELETE FROM shadow_delivery d
     WHERE d.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR d.operation_id = p_operation_id);

    UPDATE erasure_audit e
       SET work_rows = fencebridge_erase.work_rows,
           payloads = fencebridge_erase.payloads,
           rejected_deliveries = fencebridge_erase.rejected_deliveries,
           redrive_audits = fencebridge_erase.redrive_audits,
           tombstones = fencebridge_erase.tombstones
     WHERE e.id = erasure;
    RETURN NEXT;
END
$$;

DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION fencebridge_erase(text, text, text, text, smallint, text[], '
                   'bytea[], text, text) SET search_path = %I, pg_temp', current_schema());
END
$pin$;

REVOKE ALL ON FUNCTION fencebridge_erase(text, text, text, text, smallint, text[], bytea[], text,
                                         text) FROM PUBLIC;
