-- PostgreSQL roles for one fencebridge deployment.
--
-- Run it as a superuser, connected to the database fencebridge uses:
--
--     psql "postgresql://postgres@db.internal:5432/payments" -v ON_ERROR_STOP=1 \
--          -f infra/postgres/roles.sql
--
-- It is re-runnable: it creates what is missing and re-asserts attributes, ownership and
-- grants, so running it twice changes nothing. Run it once before the first
-- `fencebridge migrate` (the migrator role must exist) and again after every migrate (a table a
-- migration added gets its grants here; until then the bridge is refused access to it, loudly).
-- No password is set here: give the login roles theirs out of band (`\password <role>` in
-- psql, or your cloud's IAM database authentication). This file holds no secret.
--
-- Role names are <prefix>_migrator, <prefix>_bridge, <prefix>_operator, <prefix>_console and
-- <prefix>_tenant. The
-- prefix is `fencebridge` unless the session setting fencebridge.role_prefix names another one,
-- which lets two deployments share one server:
--
--     PGOPTIONS='-c fencebridge.role_prefix=payments_fb' psql ... -f infra/postgres/roles.sql
--
-- Roles are cluster-wide; everything else here (ownership, grants, the two functions at the
-- end) belongs to the database the script runs in.
--
-- The roles
-- ---------
-- <prefix>_migrator  LOGIN. Owns every fencebridge table; `fencebridge migrate` (the
--                    Kubernetes Job) runs as it. Nothing else does.
--
-- <prefix>_bridge    LOGIN, BYPASSRLS. The running bridge: owns nothing, may only read and
--                    write rows (SELECT/INSERT/UPDATE/DELETE on the work tables, INSERT and
--                    SELECT on the redrive audit and on identity_key (a rotation adds a
--                    key, none is ever changed), USAGE on work_item_seq, SELECT on the
--                    migration record so it can check the schema version, EXECUTE on
--                    fencebridge_erase_under_keys and fencebridge_erase, the audited
--                    erasures that keep tombstones, and on fencebridge_concurrency_room and
--                    fencebridge_claim_room, the claims' concurrency limits and token rates).
--
--     The bridge serves every tenant, so the row-level security policies of
--     bridge/sql/migrations/0001_work_store.sql must not apply to it. A table's owner is exempt
--     from them, and so is a role with BYPASSRLS. We choose BYPASSRLS and keep the bridge a
--     non-owner: an owner can also ALTER and DROP the tables, disable row-level security, rewrite
--     the policies and the immutability trigger, and erase the redrive audit. With BYPASSRLS and
--     row grants, a compromised bridge can change rows, which it must be able to do anyway, and
--     nothing more. (The simplest deployment, one role that migrates and runs, makes the bridge
--     the owner instead; that works too, as the comment in the migration says, with those
--     extra powers.) Creating a BYPASSRLS role needs a superuser.
--
-- <prefix>_operator  LOGIN, BYPASSRLS, SELECT only, read-only transactions by default. On-call
--                    inspection (`fencebridge status`, ad-hoc queries) across all tenants.
--
--     It must see every tenant's rows. The alternative to BYPASSRLS is a permissive policy
--     (`CREATE POLICY ... FOR SELECT TO <role> USING (true)`) on each table, but policies are
--     schema and belong in a migration, and a role name in a migration would tie the schema to
--     one deployment's naming. Its grants are SELECT only, so BYPASSRLS widens what it can
--     read, never what it can change; default_transaction_read_only is a second guard for
--     sessions that log in as it. Redrive, purge and erase are writes: they run with the
--     bridge's credentials, deliberately, not with this role.
--
-- <prefix>_console   LOGIN, BYPASSRLS. `fencebridge console`: what the operator reads, plus the
--                    writes of a redrive and nothing else: UPDATE on work_item; INSERT on the
--                    redrive audit (which also records payload views) and the attempt
--                    history; for a quarantined delivery decoded again through the inbox,
--                    INSERT on work_item, payload, rejected_delivery and delivery_copy (a
--                    replay's record), UPDATE on rejected_delivery and USAGE on
--                    work_item_seq; INSERT on identity_key (a redrive records the key on
--                    first use, as the bridge does). It cannot
--                    claim, settle, sweep, delete, purge, erase or change an audit or attempt
--                    record, and it is never the bridge's role: a stolen console credential
--                    can send parked work back to the queue, which the console exists to do,
--                    and every such move is audited with its actor and reason.
--
-- <prefix>_tenant    NOLOGIN group holding the tenant-facing privileges: SELECT on the work
--                    tables, the redrive audit and tenant_role (the policies read it). A tenant
--                    role is a member of this group and is mapped to exactly one tenant in
--                    tenant_role; the policies then scope it to that tenant's rows. Tenant
--                    roles read; every write goes through the bridge and its fences.
--
-- Adding a tenant role (see the function at the end):
--
--     SELECT fencebridge_add_tenant_role('acme_reader', 'acme');          -- NOLOGIN role
--     SELECT fencebridge_add_tenant_role('acme_app', 'acme', login => true);
--     SELECT fencebridge_remove_tenant_role('acme_reader');               -- unmap, ungroup
--
-- A role that bypasses row-level security (a superuser, a BYPASSRLS role, a role with the
-- table owner's privileges) is refused: the mapping would promise an isolation it cannot get.


-- 1. The cluster-wide roles. A concurrent run may create a role between our check and our
--    CREATE; duplicate_object is therefore expected and harmless, and the ALTER that follows
--    re-asserts the attributes either way.
DO $roles$
DECLARE
    prefix constant text :=
        coalesce(nullif(current_setting('fencebridge.role_prefix', true), ''), 'fencebridge');
    spec record;
BEGIN
    IF prefix !~ '^[a-z_][a-z0-9_]{0,53}$' THEN
        RAISE EXCEPTION 'fencebridge.role_prefix must be a lower-case identifier of at most 54 '
                        'characters, not %', quote_literal(prefix);
    END IF;
    FOR spec IN
        SELECT *
          FROM (VALUES ('migrator', 'LOGIN NOBYPASSRLS'),
                       ('bridge', 'LOGIN BYPASSRLS'),
                       ('operator', 'LOGIN BYPASSRLS'),
                       ('console', 'LOGIN BYPASSRLS'),
                       ('tenant', 'NOLOGIN NOBYPASSRLS')) AS s (suffix, attributes)
    LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I', prefix || '_' || spec.suffix);
        EXCEPTION WHEN duplicate_object THEN
            NULL;
        END;
        EXECUTE format(
            'ALTER ROLE %I %s NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION INHERIT',
            prefix || '_' || spec.suffix, spec.attributes);
    END LOOP;
    EXECUTE format('ALTER ROLE %I SET default_transaction_read_only = on', prefix || '_operator');
END
$roles$;


-- 2. This database: connect and schema rights, ownership of the fencebridge tables, and
--    exactly the table privileges listed below (everything else is revoked from these roles, so
--    a privilege dropped from this list disappears on the next run).
DO $grants$
DECLARE
    prefix constant text :=
        coalesce(nullif(current_setting('fencebridge.role_prefix', true), ''), 'fencebridge');
    migrator constant text := prefix || '_migrator';
    target_schema constant text := current_schema();
    -- Every table the migrations create. A migration that adds a table adds it here (the
    -- integration test fails until it does). Sequences owned by a column, such as
    -- work_item_seq and the identity sequences, follow their table's owner.
    tables constant text[] := ARRAY['work_item', 'payload', 'rejected_delivery',
                                    'redrive_audit', 'tenant_role', 'fencebridge_migration',
                                    'erasure_audit', 'identity_key', 'work_attempt',
                                    'rate_wait', 'erased_operation', 'shadow_operation',
                                    'shadow_delivery', 'outbox_message', 'outbox_relay',
                                    'token_bucket', 'outbox_audit', 'identity_key_reset',
                                    'delivery_copy'];
    -- Functions only the bridge may execute (see below), by signature.
    bridge_functions constant text[] := ARRAY['fencebridge_erase_under_keys(text, text, text, '
                                              'text, smallint[], text[], bytea[], text, text, '
                                              'boolean)',
                                              'fencebridge_erase(text, text, text, text, smallint, '
                                              'text[], bytea[], text, text)',
                                              'fencebridge_concurrency_room(jsonb)',
                                              'fencebridge_claim_room(jsonb, jsonb, '
                                              'timestamp with time zone)'];
    -- Functions the migrations create, by signature (fencebridge_expect and
    -- fencebridge_expect_new_batch: the inbox's check that a batch it wrote in one round trip
    -- was all new; fencebridge_expect_tombstone_keys: its check that it could find every
    -- tombstone; fencebridge_identity_key_recorded: the trigger that makes a new identity key
    -- wait for the erasures in progress; fencebridge_fence_epoch and fencebridge_next_fence: the
    -- fence's epoch every claim counts from; they run with their caller's rights, so anyone may
    -- call them).
    functions constant text[] := ARRAY['work_item_identity_immutable()',
                                       'fencebridge_expect(boolean, text)',
                                       'fencebridge_expect_new_batch(bigint, bigint, smallint[], '
                                       'bytea[], boolean)',
                                       'fencebridge_expect_tombstone_keys(smallint[])',
                                       'fencebridge_identity_key_recorded()',
                                       'fencebridge_fence_epoch()',
                                       'fencebridge_next_fence(bigint)'] || bridge_functions;
    -- Functions a later migration drops, revoked from everyone until it has run: the erasure
    -- without tombstones (0002; dropped by 0024), which would let a redelivery of what it
    -- erased become new work.
    retired_functions constant text[] := ARRAY['fencebridge_erase_tenant(text, text, text, text)'];
    missing text[] := '{}';
    tbl_name text;
    fn_signature text;
    grantee text;
    rel regclass;
    fn regprocedure;
    g record;
BEGIN
    IF target_schema IS NULL THEN
        RAISE EXCEPTION 'no current schema: set search_path to the schema fencebridge migrates';
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I, %I, %I, %I, %I', current_database(),
                   migrator, prefix || '_bridge', prefix || '_operator', prefix || '_console',
                   prefix || '_tenant');
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO %I', target_schema, migrator);
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I, %I, %I, %I', target_schema,
                   prefix || '_bridge', prefix || '_operator', prefix || '_console',
                   prefix || '_tenant');

    -- Adopt objects that an earlier migrate created under another role.
    FOREACH tbl_name IN ARRAY tables LOOP
        rel := to_regclass(format('%I.%I', target_schema, tbl_name));
        IF rel IS NULL THEN
            missing := missing || tbl_name;
            CONTINUE;
        END IF;
        IF (SELECT relowner FROM pg_class WHERE oid = rel)
           <> (SELECT oid FROM pg_roles WHERE rolname = migrator) THEN
            EXECUTE format('ALTER TABLE %s OWNER TO %I', rel, migrator);
        END IF;
        FOREACH grantee IN ARRAY ARRAY[prefix || '_bridge', prefix || '_operator',
                                       prefix || '_console', prefix || '_tenant'] LOOP
            EXECUTE format('REVOKE ALL ON TABLE %s FROM %I', rel, grantee);
        END LOOP;
    END LOOP;
    FOREACH fn_signature IN ARRAY functions LOOP
        fn := to_regprocedure(format('%I.%s', target_schema, fn_signature));
        IF fn IS NOT NULL THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, migrator);
        END IF;
    END LOOP;
    -- Functions only the bridge may call: `fencebridge erase` runs with the bridge's
    -- credentials, and the erasure functions (SECURITY DEFINER) are the one way it can remove
    -- redrive audit rows and write tombstones, and they record the erasure; the claims' rooms
    -- (migrations 0011 and 0018) take the limited job types' claim locks, and only the bridge
    -- claims.
    FOREACH fn_signature IN ARRAY bridge_functions LOOP
        fn := to_regprocedure(format('%I.%s', target_schema, fn_signature));
        IF fn IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, %I, %I, %I', fn,
                           prefix || '_operator', prefix || '_console', prefix || '_tenant');
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, prefix || '_bridge');
        END IF;
    END LOOP;
    FOREACH fn_signature IN ARRAY retired_functions LOOP
        fn := to_regprocedure(format('%I.%s', target_schema, fn_signature));
        IF fn IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, %I, %I, %I, %I', fn,
                           prefix || '_bridge', prefix || '_operator', prefix || '_console',
                           prefix || '_tenant');
        END IF;
    END LOOP;

    FOR g IN
        SELECT *
          FROM (VALUES ('work_item', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       ('payload', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       ('rejected_delivery', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       -- replays are appended by the inbox, removed with their row
                       ('delivery_copy', 'bridge', 'SELECT, INSERT, DELETE'),
                       -- the audit is append-only for the bridge
                       ('redrive_audit', 'bridge', 'SELECT, INSERT'),
                       ('fencebridge_migration', 'bridge', 'SELECT'),
                       -- keys are recorded, never changed: a rotation adds one
                       ('identity_key', 'bridge', 'SELECT, INSERT'),
                       -- attempt history: written and trimmed by the claim and settle statements
                       ('work_attempt', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       -- rate limit waits: upserted and cleaned by rate_limited, read by claims
                       ('rate_wait', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       -- tombstones: read by the inbox, purged past the horizon; written
                       -- only by fencebridge_erase
                       ('erased_operation', 'bridge', 'SELECT, DELETE'),
                       -- shadow subscriptions: written by their inbox, cleared by `shadow clear`
                       ('shadow_operation', 'bridge', 'SELECT, INSERT, DELETE'),
                       ('shadow_delivery', 'bridge', 'SELECT, INSERT, DELETE'),
                       -- the outbox: written in class A transactions, marked by the relay,
                       -- purged by retention; the relay's lease and fence per destination
                       ('outbox_message', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       ('outbox_relay', 'bridge', 'SELECT, INSERT, UPDATE'),
                       -- who sent parked messages back (`fencebridge resend`): append-only
                       ('outbox_audit', 'bridge', 'SELECT, INSERT'),
                       -- token buckets: read and spent by the limited claims
                       ('token_bucket', 'bridge', 'SELECT, INSERT, UPDATE, DELETE'),
                       ('work_item', 'operator', 'SELECT'),
                       ('payload', 'operator', 'SELECT'),
                       ('rejected_delivery', 'operator', 'SELECT'),
                       ('delivery_copy', 'operator', 'SELECT'),
                       ('redrive_audit', 'operator', 'SELECT'),
                       ('tenant_role', 'operator', 'SELECT'),
                       ('fencebridge_migration', 'operator', 'SELECT'),
                       ('erasure_audit', 'operator', 'SELECT'),
                       ('identity_key', 'operator', 'SELECT'),
                       ('work_attempt', 'operator', 'SELECT'),
                       ('rate_wait', 'operator', 'SELECT'),
                       ('shadow_operation', 'operator', 'SELECT'),
                       ('shadow_delivery', 'operator', 'SELECT'),
                       ('erased_operation', 'operator', 'SELECT'),
                       ('outbox_message', 'operator', 'SELECT'),
                       ('outbox_relay', 'operator', 'SELECT'),
                       ('outbox_audit', 'operator', 'SELECT'),
                       -- who replaced an unused identity key (`fencebridge identity reset`,
                       -- run as the migrator, the tables' owner)
                       ('identity_key_reset', 'operator', 'SELECT'),
                       ('token_bucket', 'operator', 'SELECT'),
                       -- the console reads what the operator reads and writes what a redrive
                       -- (and an audited payload view) writes
                       ('work_item', 'console', 'SELECT, INSERT, UPDATE'),
                       ('payload', 'console', 'SELECT, INSERT'),
                       ('rejected_delivery', 'console', 'SELECT, INSERT, UPDATE'),
                       ('delivery_copy', 'console', 'SELECT, INSERT'),
                       ('redrive_audit', 'console', 'SELECT, INSERT'),
                       ('tenant_role', 'console', 'SELECT'),
                       ('fencebridge_migration', 'console', 'SELECT'),
                       ('erasure_audit', 'console', 'SELECT'),
                       ('identity_key', 'console', 'SELECT, INSERT'),
                       ('work_attempt', 'console', 'SELECT, INSERT'),
                       ('rate_wait', 'console', 'SELECT'),
                       ('shadow_operation', 'console', 'SELECT'),
                       ('shadow_delivery', 'console', 'SELECT'),
                       ('erased_operation', 'console', 'SELECT'),
                       ('outbox_message', 'console', 'SELECT'),
                       ('outbox_relay', 'console', 'SELECT'),
                       ('outbox_audit', 'console', 'SELECT'),
                       ('token_bucket', 'console', 'SELECT'),
                       ('work_item', 'tenant', 'SELECT'),
                       ('payload', 'tenant', 'SELECT'),
                       ('rejected_delivery', 'tenant', 'SELECT'),
                       ('redrive_audit', 'tenant', 'SELECT'),
                       ('work_attempt', 'tenant', 'SELECT'),
                       ('rate_wait', 'tenant', 'SELECT'),
                       ('shadow_operation', 'tenant', 'SELECT'),
                       ('shadow_delivery', 'tenant', 'SELECT'),
                       ('outbox_message', 'tenant', 'SELECT'),
                       ('token_bucket', 'tenant', 'SELECT'),
                       ('tenant_role', 'tenant', 'SELECT')) AS t (tbl, suffix, privileges)
    LOOP
        rel := to_regclass(format('%I.%I', target_schema, g.tbl));
        IF rel IS NOT NULL THEN
            EXECUTE format('GRANT %s ON TABLE %s TO %I', g.privileges, rel,
                           prefix || '_' || g.suffix);
        END IF;
    END LOOP;

    -- nextval() in the ingest statement needs USAGE; identity columns need nothing.
    rel := to_regclass(format('%I.%I', target_schema, 'work_item_seq'));
    IF rel IS NOT NULL THEN
        EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM %I, %I, %I, %I', rel,
                       prefix || '_bridge', prefix || '_operator', prefix || '_console',
                       prefix || '_tenant');
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I, %I', rel, prefix || '_bridge',
                       prefix || '_console');
    END IF;

    IF cardinality(missing) > 0 THEN
        RAISE NOTICE 'fencebridge roles: % not migrated yet; run `fencebridge migrate` as % '
                     'and then this file again', array_to_string(missing, ', '), migrator;
    END IF;
END
$grants$;


-- 3. Tenant roles. SECURITY INVOKER: whoever calls these needs the right to create roles and
--    to write tenant_role (a superuser, as for the rest of this file). The search path is
--    fixed to the schema this file ran in, so the functions find the right tenant_role table.

-- Create (if missing) a role for one tenant, put it in the tenant group and map it to the
-- tenant. `login` applies only when the role is created here. Re-running it with the same
-- arguments changes nothing; mapping a role to a second tenant is refused.
CREATE OR REPLACE FUNCTION fencebridge_add_tenant_role(
    rolename text,
    tenant text,
    login boolean DEFAULT false,
    tenant_group text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    grp constant text := coalesce(
        tenant_group,
        coalesce(nullif(current_setting('fencebridge.role_prefix', true), ''), 'fencebridge')
            || '_tenant');
    existing pg_roles%ROWTYPE;
    mapped text;
BEGIN
    IF coalesce(rolename, '') = '' OR coalesce(tenant, '') = '' THEN
        RAISE EXCEPTION 'a tenant role needs a role name and a tenant id';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grp) THEN
        RAISE EXCEPTION 'tenant group role % does not exist: run infra/postgres/roles.sql first',
                        quote_ident(grp);
    END IF;
    SELECT * INTO existing FROM pg_roles WHERE rolname = rolename;
    IF NOT FOUND THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I %s NOSUPERUSER NOCREATEDB NOCREATEROLE '
                           'NOREPLICATION NOBYPASSRLS INHERIT',
                           rolename, CASE WHEN login THEN 'LOGIN' ELSE 'NOLOGIN' END);
        EXCEPTION WHEN duplicate_object THEN
            NULL;  -- created concurrently; checked below like any existing role
        END;
        SELECT * INTO existing FROM pg_roles WHERE rolname = rolename;
    END IF;
    IF existing.rolsuper OR existing.rolbypassrls
       OR pg_has_role(rolename, (SELECT relowner FROM pg_class
                                  WHERE oid = 'work_item'::regclass), 'USAGE') THEN
        RAISE EXCEPTION 'role % bypasses row-level security (superuser, BYPASSRLS or the table '
                        'owner''s privileges): it cannot be scoped to one tenant',
                        quote_ident(rolename);
    END IF;
    IF NOT pg_has_role(rolename, grp, 'MEMBER') THEN
        EXECUTE format('GRANT %I TO %I', grp, rolename);
    END IF;
    INSERT INTO tenant_role (role_name, tenant_id) VALUES (rolename, tenant)
        ON CONFLICT (role_name) DO NOTHING;
    SELECT t.tenant_id INTO mapped FROM tenant_role t WHERE t.role_name = rolename;
    IF mapped IS DISTINCT FROM tenant THEN
        RAISE EXCEPTION 'role % is already mapped to another tenant; a tenant role maps to '
                        'exactly one tenant', quote_ident(rolename);
    END IF;
END
$fn$;

-- Unmap a tenant role and take it out of the tenant group; returns whether it was mapped. The
-- role itself stays: drop it with DROP OWNED BY (in every database) and DROP ROLE.
CREATE OR REPLACE FUNCTION fencebridge_remove_tenant_role(
    rolename text,
    tenant_group text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    grp constant text := coalesce(
        tenant_group,
        coalesce(nullif(current_setting('fencebridge.role_prefix', true), ''), 'fencebridge')
            || '_tenant');
    removed boolean;
BEGIN
    DELETE FROM tenant_role t WHERE t.role_name = rolename;
    removed := FOUND;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = rolename)
       AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grp)
       AND pg_has_role(rolename, grp, 'MEMBER') AND rolename <> grp THEN
        EXECUTE format('REVOKE %I FROM %I', grp, rolename);
    END IF;
    RETURN removed;
END
$fn$;

REVOKE ALL ON FUNCTION fencebridge_add_tenant_role(text, text, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencebridge_remove_tenant_role(text, text) FROM PUBLIC;
