-- Token rates ([jobs.<name>] rate, burst, rate_per_tenant, burst_per_tenant): at most `burst`
-- claims of a job type, or of a (job type, tenant), at once, and `rate` a second after that,
-- across every bridge process. Like the concurrency limits (0011), the rates live in the
-- configuration: each claim passes the rates of the job types it may claim, and the room they
-- leave is counted under the same per-job-type claim locks, then spent by the claim statement
-- itself, in the transaction that claims.
--
-- One bucket per rate-limited key, kept as the generic cell rate algorithm keeps it: the one
-- time `full_at` at which the bucket holds its whole burst again. At time t it holds
--   burst - (full_at - t) * rate   tokens when full_at > t,   burst otherwise,
-- and a claim of n rows at t moves full_at to max(full_at, t) + n / rate (rounded up to the
-- microsecond, so never less). Nothing has to refill the buckets: the time does. A key with no
-- row holds its whole burst; so does a row whose full_at has passed. `tenant_id` '' is the
-- bucket of the whole job type (no tenant id is empty); any other value, that tenant's bucket.
--
-- Why the bound holds with many processes: every claim that spends a key's tokens holds the
-- key's job type lock (pg_advisory_xact_lock(731023, hashtext(job_type)), the concurrency
-- limits' lock) from before it counts until it commits, and counts with a fresh snapshot
-- (fencebridge_claim_room, below). So the claims of one key are serialised, and each sees the
-- spending of every claim before it. Whatever order the claims come in, claims at times t
-- (the claim's clock: claimed_at of its rows) within any window [a, b] number at most
-- burst + rate * (b - a): the first of them leaves full_at >= a + its n / rate, each later one
-- adds its own, and the last was admitted only while full_at <= its t + burst / rate <= b +
-- burst / rate.
--
-- A new table and a new function; the erasure functions replaced to delete a tenant's
-- buckets. Nothing existing is rewritten. The running release neither reads nor writes the
-- buckets (it has no rates to enforce) and still calls fencebridge_concurrency_room, which
-- takes the same locks, so both releases' concurrency limits hold together.
CREATE TABLE token_bucket (
    job_type  text        NOT NULL,
    tenant_id text        NOT NULL,
    full_at   timestamptz NOT NULL,
    PRIMARY KEY (job_type, tenant_id)
);

-- A tenant's bucket names the tenant: its role sees its own (never the job type's, '').
ALTER TABLE token_bucket ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON token_bucket
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

-- The room of every limited key of a claim: its concurrency slots (0011's function, tokens
-- false) and its tokens (tokens true). p_slots is {"<job_type>": [total, per tenant]} as 0011
-- takes it; p_rates is {"<job_type>": [count, period_us, burst, tenant count, tenant
-- period_us, tenant burst]} (a rate of count per period_us microseconds; NULLs where the job
-- type has no such rate); p_now is the claim's clock. Either may be NULL.
--
-- It takes the claim lock of every job type of either map, all at once and in one order (job
-- type names, byte order; 0011's function then takes its own again, which a holder is granted
-- at once), and only then reads the buckets: a VOLATILE function's query takes a fresh
-- snapshot (READ COMMITTED), so it sees what every claim that held the lock before committed.
-- It writes nothing: the claim statement spends the tokens (an INSERT ... ON CONFLICT DO
-- UPDATE, which updates the newest row, whatever the statement's own snapshot).
--
-- Rows, as 0011's: (job type, NULL, room) for the job type's bucket; (job type, '', burst)
-- for a tenant with a full bucket (every tenant's bound); (job type, tenant, room) for each
-- tenant whose bucket is not full. The room is whole tokens, never below 0 (a claim whose
-- clock is behind the bucket's, having waited for the lock, may find less than nothing).
CREATE FUNCTION fencebridge_claim_room(p_slots jsonb, p_rates jsonb, p_now timestamptz)
RETURNS TABLE (job_type text, tenant_id text, room bigint, tokens boolean)
LANGUAGE plpgsql
VOLATILE
ROWS 10
AS $$
#variable_conflict use_column
DECLARE
    limited text;
BEGIN
    FOR limited IN
        SELECT k
          FROM (SELECT jsonb_object_keys(coalesce(p_slots, '{}'::jsonb)) AS k
                UNION
                SELECT jsonb_object_keys(coalesce(p_rates, '{}'::jsonb))) AS keys
         ORDER BY k COLLATE "C"
    LOOP
        PERFORM pg_advisory_xact_lock(731023, hashtext(limited));
    END LOOP;
    IF coalesce(p_slots, '{}'::jsonb) <> '{}'::jsonb THEN
        RETURN QUERY
        SELECT c.job_type, c.tenant_id, c.room, false FROM fencebridge_concurrency_room(p_slots) c;
    END IF;
    IF coalesce(p_rates, '{}'::jsonb) = '{}'::jsonb THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH r AS (
        SELECT e.key AS job_type,
               (e.value ->> 0)::numeric AS n, (e.value ->> 1)::numeric AS period,
               (e.value ->> 2)::bigint AS burst,
               (e.value ->> 3)::numeric AS tenant_n, (e.value ->> 4)::numeric AS tenant_period,
               (e.value ->> 5)::bigint AS tenant_burst
          FROM jsonb_each(p_rates) AS e
    )
    SELECT r.job_type, NULL::text,
           CASE WHEN b.full_at IS NULL OR b.full_at <= p_now THEN r.burst
                ELSE greatest(0, r.burst - ceil(extract(epoch FROM b.full_at - p_now) * 1000000
                                                * r.n / r.period))::bigint
           END,
           true
      FROM r
      LEFT JOIN token_bucket b ON b.job_type = r.job_type AND b.tenant_id = ''
     WHERE r.n IS NOT NULL
    UNION ALL
    SELECT r.job_type, ''::text, r.tenant_burst, true
      FROM r
     WHERE r.tenant_n IS NOT NULL
    UNION ALL
    SELECT r.job_type, b.tenant_id,
           greatest(0, r.tenant_burst - ceil(extract(epoch FROM b.full_at - p_now) * 1000000
                                             * r.tenant_n / r.tenant_period))::bigint,
           true
      FROM r
      JOIN token_bucket b ON b.job_type = r.job_type AND b.tenant_id <> '' AND b.full_at > p_now
     WHERE r.tenant_n IS NOT NULL;
END
$$;

-- Buckets name their tenant, so erasing the tenant removes its buckets too: the erasure
-- functions of 0016, replaced with one more DELETE each (same signatures and results;
-- ownership and grants stay, the pinned search_path is set again since a replacement resets it).
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
    DELETE FROM outbox_message m WHERE m.tenant_id = p_tenant_id;
    DELETE FROM token_bucket b WHERE b.tenant_id = p_tenant_id;

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

-- The erasure that keeps tombstones (0016's text), replaced the same way: erasing a whole tenant
-- deletes its buckets (erasing one operation leaves them: they hold no operation).
CREATE OR REPLACE FUNCTION fencebridge_erase(
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
        DELETE FROM token_bucket b WHERE b.tenant_id = p_tenant_id;
    END IF;
    -- its outbox messages, sent or not (an unsent one is never sent)
    DELETE FROM outbox_message m
     WHERE m.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR m.operation_id = p_operation_id);
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
