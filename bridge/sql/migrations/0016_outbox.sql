-- The transactional outbox: messages a class A handler publishes, written in the transaction
-- that holds its work row under the fence and commits its business write and its completion.
-- A transaction that does not commit (a stale worker's, a failed run's) leaves no message.
--
-- A relay in `fencebridge run` sends a destination's pending messages after commit, in seq
-- order, and marks them sent or parked under its own fence (outbox_relay, below). A message may
-- leave more than once (a relay that lost its lease while sending, a send whose answer was
-- lost); every copy carries the same message_id, derived from the operation and the message's
-- place in it, which is what its consumers deduplicate on.
--
-- New tables only: nothing existing is rewritten or locked, and the running release ignores them.
CREATE TABLE outbox_message (
    -- commit order within a destination is approximated by this (claim order of the relay)
    seq           bigint      GENERATED ALWAYS AS IDENTITY,
    -- opaque and deterministic: the operation's idempotency key and the message's number in it
    message_id    text        PRIMARY KEY CHECK (message_id <> ''),
    tenant_id     text        NOT NULL CHECK (tenant_id <> ''),
    operation_id  text        NOT NULL CHECK (operation_id <> ''),
    -- the fence of the run whose transaction wrote it
    fence         bigint      NOT NULL,
    destination   text        NOT NULL,
    body          bytea       NOT NULL,
    attributes    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    ordering_key  text,
    -- W3C traceparent of the run that wrote it, sent along so the trace continues downstream
    trace_context text,
    state         text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'sent', 'parked')),
    -- sends that failed for this message (a send whose whole call failed is not counted)
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error    text,
    -- why the relay gave up on it (parked messages are never sent without an operator)
    park_reason   text,
    -- the relay fence that marked it sent or parked
    relay_fence   bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz,
    parked_at     timestamptz,
    CHECK ((state = 'sent') = (sent_at IS NOT NULL)),
    CHECK ((state = 'parked') = (park_reason IS NOT NULL))
);
-- Its indexes are built in 0017, concurrently.

ALTER TABLE outbox_message ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON outbox_message
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

-- One relay per destination at a time, across processes: a lease from the database clock and a
-- fence, +1 on every takeover. A relay marks messages only while its fence is current (the mark
-- locks this row FOR SHARE and checks the fence inside the same transaction).
CREATE TABLE outbox_relay (
    destination      text        PRIMARY KEY,
    owner            text,
    fence            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Outbox messages carry a tenant's bodies, so erasing the tenant removes them too: the erasure
-- function of 0009, replaced with one more DELETE (same signature and result; ownership and
-- grants stay, the pinned search_path is set again since a replacement resets it).
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

-- The erasure that keeps tombstones (0014), replaced the same way with the outbox's DELETE.
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
