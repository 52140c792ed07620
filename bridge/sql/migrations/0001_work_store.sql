-- The work store: one row per operation, its payload by reference, and the
-- deliveries that could not become work (payload conflicts, undecodable input).

-- Ingest order, drawn per delivery in arrival order (see store/ingest_insert.sql).
CREATE SEQUENCE work_item_seq;

-- One row per operation (tenant_id, operation_id): the inbox record and the schedule at once.
CREATE TABLE work_item (
    tenant_id         text        NOT NULL CHECK (tenant_id <> ''),
    operation_id      text        NOT NULL CHECK (operation_id <> ''),
    subscription      text        NOT NULL,
    job_type          text        NOT NULL,
    target_class      text        NOT NULL CHECK (target_class IN ('A', 'B', 'C', 'D')),
    schema_version    text,
    -- sha256 of the approved payload bytes; immutable once written.
    payload_hash      bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
    -- pointer into payload (or an object store); raw payloads never live in this table.
    payload_ref       text        NOT NULL,
    state             text        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'claimed', 'succeeded', 'failed_terminal', 'unknown', 'quarantined')),
    -- +1 on every claim; every worker write carries it and is accepted only while it is current.
    fence             bigint      NOT NULL DEFAULT 0,
    lease_owner       text,
    lease_expires_at  timestamptz,
    attempts          integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      integer     NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    -- fence under which an external call was begun (target class D: at most one call, ever).
    intent_fence      bigint,
    outcome_code      text,
    outcome_detail    text,
    -- ingest order; with ordering_key it decides which row of a group may be claimed next.
    seq               bigint      NOT NULL DEFAULT nextval('work_item_seq'),
    ordering_key      text,
    broker_message_id text,
    receive_count     integer,
    trace_context     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    claimed_at        timestamptz,
    settled_at        timestamptz,
    PRIMARY KEY (tenant_id, operation_id),
    CHECK ((state = 'claimed') = (lease_expires_at IS NOT NULL))
) WITH (
    -- Heartbeats touch only unindexed columns, so they can be HOT updates within the page.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

ALTER SEQUENCE work_item_seq OWNED BY work_item.seq;

-- Claim reads only these two indexes; terminal rows are in neither, so claim cost does not grow
-- with history. Expired claims are found through the (small, in-flight) set of claimed rows;
-- lease_expires_at and updated_at are deliberately left out of every index so that a heartbeat
-- stays a HOT update.
CREATE INDEX work_item_queued ON work_item (next_attempt_at, seq) WHERE state = 'queued';
CREATE INDEX work_item_claimed ON work_item (claimed_at) WHERE state = 'claimed';
-- Ordered groups (SQS FIFO group, Pub/Sub ordering key): the earliest unsettled row per group.
CREATE INDEX work_item_open_group ON work_item (subscription, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'claimed');
-- Operator views: parked rows by age.
CREATE INDEX work_item_parked ON work_item (state, settled_at) WHERE state IN ('unknown', 'quarantined');

-- Payload bytes, kept apart so retention and erasure can reach them without touching the schedule.
CREATE TABLE payload (
    payload_ref text        PRIMARY KEY,
    tenant_id   text,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payload_tenant ON payload (tenant_id);

-- Deliveries that did not become work: a payload-hash conflict on an existing key, or input the
-- subscription's rules could not decode with confidence (quarantined, with the reason).
CREATE TABLE rejected_delivery (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind              text        NOT NULL CHECK (kind IN ('conflict', 'quarantined')),
    reason            text        NOT NULL,
    subscription      text        NOT NULL,
    broker_message_id text,
    tenant_id         text,
    operation_id      text,
    job_type          text,
    payload_hash      bytea,
    payload_ref       text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    redriven_at       timestamptz
);
CREATE INDEX rejected_delivery_tenant ON rejected_delivery (tenant_id, operation_id);
CREATE INDEX rejected_delivery_open ON rejected_delivery (created_at) WHERE redriven_at IS NULL;

-- Every redrive is an audited, consequential action.
CREATE TABLE redrive_audit (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text        NOT NULL,
    reason       text        NOT NULL,
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    from_state   text        NOT NULL,
    to_state     text        NOT NULL,
    fence        bigint      NOT NULL,
    attempts     integer     NOT NULL
);
CREATE INDEX redrive_audit_key ON redrive_audit (tenant_id, operation_id);

-- Tenant roles: a database role mapped to exactly one tenant sees and changes only that tenant's
-- rows. The table owner and roles with BYPASSRLS (the bridge and the operator, see
-- infra/postgres/roles.sql) are not subject to these policies.
CREATE TABLE tenant_role (
    role_name text PRIMARY KEY,
    tenant_id text NOT NULL
);
ALTER TABLE tenant_role ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_role_self ON tenant_role USING (role_name = current_user);

ALTER TABLE work_item ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON work_item
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

ALTER TABLE payload ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON payload
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

ALTER TABLE rejected_delivery ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON rejected_delivery
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user))
    WITH CHECK (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

ALTER TABLE redrive_audit ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON redrive_audit
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));

-- An operation's identity and its approved payload hash never change once written; the store
-- never tries, and this trigger makes sure nobody else does either.
CREATE FUNCTION work_item_identity_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id <> OLD.tenant_id
       OR NEW.operation_id <> OLD.operation_id
       OR NEW.payload_hash <> OLD.payload_hash
       OR NEW.payload_ref <> OLD.payload_ref THEN
        RAISE EXCEPTION 'work_item identity and payload hash are immutable'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER work_item_identity_immutable
    BEFORE UPDATE OF tenant_id, operation_id, payload_hash, payload_ref ON work_item
    FOR EACH ROW EXECUTE FUNCTION work_item_identity_immutable();
