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
-- Its indexes are built in 0016, concurrently.

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
