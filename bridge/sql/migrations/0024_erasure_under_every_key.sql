-- Erasure across identity key rotations, the outbox messages an erasure would drop, and the
-- contract of the erasure without tombstones.
--
-- A tombstone (0014) is found by its keyed hash, and an inbox looks it up under the keys its
-- process holds. A bridge started before `fencebridge identity rotate` holds the old key alone,
-- and keeps running; an erasure after the rotation hashed its tombstones under the new key
-- only, so such a bridge wrote a redelivery of the erased operation as new work. From here:
--
-- * an erasure writes each operation's tombstone under every key the erasing process holds
--   (fencebridge_erase_under_keys), and only while it holds the database's current key,
--   checked under a lock every new key's insert waits for (the trigger below): a bridge
--   started with the new key alone never misses a tombstone hashed under the old one;
-- * each key records the first erasure that left no tombstone under it
--   (identity_key.missed_erasure_at), in the erasure's transaction;
-- * an inbox's tombstone lookup checks, in the same snapshot or a later one, that some key
--   its process holds was never missed (fencebridge_expect_tombstone_keys); otherwise it
--   refuses (SQLSTATE FBKEY) and writes nothing. Erasures from before its start were checked
--   when it started (every erasure must have a tombstone under a key it holds).
--
-- So a bridge on an old key keeps writing while erasures are hashed under its key too, and
-- stops, saying to restart it with the current key, once one was not. No order of rotations,
-- erasures and restarts makes a redelivered erased operation new work.
--
-- An erasure also refused nothing about the outbox: it deleted committed messages the relay had
-- not sent yet, uncounted. Now a pending message in scope refuses it (as a queued row does),
-- a parked one refuses it unless the caller asks to drop parked messages, and the messages it
-- removes are counted and recorded.
--
-- Expand: a nullable column, a trigger, new functions, two columns on erasure_audit. The running
-- release calls fencebridge_erase and fencebridge_expect_new_batch, replaced here with the same
-- signatures and results: its erasures keep their one key (now checked to be the current one,
-- and marking the keys they miss) and its one-statement inbox write refuses like this
-- release's. Its careful write (a batch that was not all new) does not check: rotate once
-- every bridge runs this release (docs/operations.md, "Rotating the identity key").
--
-- Contract: fencebridge_erase_tenant (0002, replaced by 0009, 0016 and 0018), the erasure
-- without tombstones that the releases before 0014 called; no release since calls it.

ALTER TABLE identity_key ADD COLUMN missed_erasure_at timestamptz;

-- Every key recorded (a first use, a rotation) waits for the erasures in progress, which hold
-- this lock shared from the moment they read the current key until they commit; an erasure that
-- starts while a key is being recorded waits for it and then reads it. One lock number, apart
-- from the migrator's (...101), the sweeper's (...102) and the purge's (...103).
CREATE FUNCTION fencebridge_identity_key_recorded() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7310231559371104);
    RETURN NEW;
END
$$;

CREATE TRIGGER identity_key_recorded
    BEFORE INSERT ON identity_key
    FOR EACH ROW EXECUTE FUNCTION fencebridge_identity_key_recorded();

ALTER TABLE erasure_audit
    ADD COLUMN outbox_sent   integer,
    ADD COLUMN outbox_parked integer;

-- The inbox's check that its tombstone lookup could find every tombstone: p_key_id holds the
-- key id of each hash it looked up by (so every key its process holds). Refuses, SQLSTATE FBKEY,
-- when every one of them was missed by an erasure (identity_key.missed_erasure_at): an
-- erasure since its process started hashed its tombstones under none of its keys. With no key
-- (a store without identity keys looks tombstones up by existence) there is nothing to check.
--
-- It reads identity_key in a snapshot of its own, taken after the one the lookup used (it is
-- called once the lookup's statement has its snapshot, or in the same query): an erasure whose
-- tombstones the lookup saw is seen here with the keys it missed.
CREATE FUNCTION fencebridge_expect_tombstone_keys(p_key_id smallint[]) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    missed timestamptz;
    newest smallint;
BEGIN
    IF coalesce(cardinality(p_key_id), 0) = 0
       OR EXISTS (SELECT 1 FROM identity_key k
                   WHERE k.key_id = ANY (p_key_id) AND k.missed_erasure_at IS NULL) THEN
        RETURN true;
    END IF;
    SELECT date_trunc('second', max(k.missed_erasure_at)) INTO missed
      FROM identity_key k WHERE k.key_id = ANY (p_key_id);
    SELECT max(k.key_id) INTO newest FROM identity_key k;
    RAISE EXCEPTION 'fencebridge: since %, erasures have left tombstones that none of the identity keys this process holds (key %) can look up, so it cannot recognise every erased operation; nothing was written',
                    missed, array_to_string(ARRAY(SELECT DISTINCT unnest(p_key_id) ORDER BY 1), ', key ')
        USING ERRCODE = 'FBKEY',
              HINT = format('restart it with FENCEBRIDGE_IDENTITY_KEY set to key %s, the current '
                            'key, and the earlier keys in FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS '
                            '(`fencebridge identity status`)', newest);
END
$$;

-- 0023's check, replaced (same signature and result): the tombstone lookup and the read of the
-- keys' marks in one query (one snapshot), then the refusal of a process whose every key an
-- erasure missed (FBKEY) before the refusal of a batch that was not all new (FBNEW). Refusing
-- FBKEY first matters to the running release too: on FBNEW it writes the batch the careful way,
-- which does not check.
CREATE OR REPLACE FUNCTION fencebridge_expect_new_batch(p_inserted bigint, p_expected bigint,
                                                        p_key_id smallint[],
                                                        p_operation_hash bytea[],
                                                        p_any_erased boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    erased boolean;
    covered boolean;
BEGIN
    SELECT EXISTS (SELECT 1
                     FROM unnest(p_key_id, p_operation_hash) AS c(key_id, operation_hash)
                     JOIN erased_operation e USING (key_id, operation_hash))
           OR (p_any_erased AND EXISTS (SELECT 1 FROM erased_operation)),
           coalesce(cardinality(p_key_id), 0) = 0
           OR EXISTS (SELECT 1 FROM identity_key k
                       WHERE k.key_id = ANY (p_key_id) AND k.missed_erasure_at IS NULL)
      INTO erased, covered;
    IF NOT covered THEN
        PERFORM fencebridge_expect_tombstone_keys(p_key_id);
    END IF;
    IF p_inserted IS DISTINCT FROM p_expected OR erased THEN
        RAISE EXCEPTION 'fencebridge: expected every key of the batch new, and no tombstone'
            USING ERRCODE = 'FBNEW';
    END IF;
    RETURN true;
END
$$;

-- Erase one tenant, or one operation of it, as fencebridge_erase (0014, 0016, 0018) does, with
-- these differences:
--
-- * each operation's tombstone is written under every key the caller holds (p_key_ids): the
--   keyed hash of operation i (1-based, of p_operation_ids) under key j of p_key_ids is
--   p_operation_hashes[(i - 1) * cardinality(p_key_ids) + j]. The keys must include the
--   database's current one, read under the shared lock the insert of a new key waits for; the
--   other recorded keys are marked missed (missed_erasure_at, the first time only) and
--   returned in missed_keys;
-- * a pending outbox message in scope (committed, not sent yet) refuses the erasure, and a
--   parked one too unless p_drop_parked; the messages removed are counted (sent, parked). The
--   messages are not locked (a relay marking them would wait for the erasure, and two
--   statements locking many rows in their own orders can deadlock): the delete takes only
--   sent and dropped parked ones, and whatever is left in scope at the end refuses it.
--
-- `tombstones` counts the operations given a tombstone (under the current key), as before.
CREATE FUNCTION fencebridge_erase_under_keys(
    p_tenant_id text,
    p_operation_id text,
    p_tenant_hash text,
    p_operation_hash text,
    p_key_ids smallint[],
    p_operation_ids text[],
    p_operation_hashes bytea[],
    p_actor text,
    p_reason text,
    p_drop_parked boolean
) RETURNS TABLE (work_rows integer, payloads integer, rejected_deliveries integer,
                 redrive_audits integer, tombstones integer, outbox_sent integer,
                 outbox_parked integer, missed_keys smallint[])
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    refs text[];
    keys smallint[];
    open_rows integer;
    unhashed integer;
    pending integer;
    parked integer;
    current_key smallint;
    erasure bigint;
BEGIN
    IF coalesce(p_tenant_id, '') = '' OR coalesce(p_tenant_hash, '') = '' THEN
        RAISE EXCEPTION 'an erasure needs a tenant id and its hash'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_operation_id = '' OR (p_operation_id IS NULL) <> (p_operation_hash IS NULL) THEN
        RAISE EXCEPTION 'an erasure of one operation needs its id and its hash'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    p_operation_ids := coalesce(p_operation_ids, '{}');
    p_operation_hashes := coalesce(p_operation_hashes, '{}');
    keys := ARRAY(SELECT DISTINCT k FROM unnest(p_key_ids) AS k WHERE k IS NOT NULL ORDER BY k);
    IF cardinality(keys) = 0 OR cardinality(keys) <> cardinality(p_key_ids) THEN
        RAISE EXCEPTION 'an erasure needs the identity keys its tombstones are hashed under, each once'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(p_operation_hashes) <> cardinality(p_operation_ids) * cardinality(p_key_ids)
    THEN
        RAISE EXCEPTION 'one keyed hash per operation id and identity key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM 1 FROM work_item w
      WHERE w.tenant_id = p_tenant_id
        AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)
      FOR UPDATE;
    SELECT count(*) FILTER (WHERE w.state IN ('queued', 'claimed')),
           count(*) FILTER (WHERE w.operation_id <> ALL (p_operation_ids))
      INTO open_rows, unhashed
      FROM work_item w
     WHERE w.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR w.operation_id = p_operation_id);
    -- the scope's outbox messages not sent yet (checked again once the sent ones are deleted)
    SELECT count(*) FILTER (WHERE m.state = 'pending'),
           count(*) FILTER (WHERE m.state = 'parked')
      INTO pending, parked
      FROM outbox_message m
     WHERE m.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR m.operation_id = p_operation_id);
    IF open_rows > 0 THEN
        RAISE EXCEPTION 'erasure refused: % operation(s) in scope are queued or claimed', open_rows
            USING ERRCODE = 'object_in_use',
                  HINT = 'erase once they have settled or been parked; nothing was erased';
    END IF;
    IF pending > 0 THEN
        RAISE EXCEPTION 'erasure refused: % outbox message(s) in scope are committed and not sent yet', pending
            USING ERRCODE = 'object_in_use',
                  HINT = 'erase once the relay has sent them (an erasure would drop them unsent); '
                         'nothing was erased';
    END IF;
    IF parked > 0 AND NOT coalesce(p_drop_parked, false) THEN
        RAISE EXCEPTION 'erasure refused: % outbox message(s) in scope are parked, never sent', parked
            USING ERRCODE = 'object_in_use',
                  HINT = 'send them again first, or erase with --drop-parked-messages to drop them '
                         '(counted and recorded); nothing was erased';
    END IF;
    IF unhashed > 0 THEN
        RAISE EXCEPTION 'erasure refused: % operation(s) were written after their hashes were computed', unhashed
            USING ERRCODE = 'serialization_failure', HINT = 'run the erasure again';
    END IF;

    -- The current key, read once no new key can be recorded before this erasure commits. With
    -- none recorded yet, the first key recorded will be key 1, the key of every row so far.
    PERFORM pg_advisory_xact_lock_shared(7310231559371104);
    SELECT coalesce(max(k.key_id), 1) INTO current_key FROM identity_key k;
    IF NOT current_key = ANY (keys) THEN
        RAISE EXCEPTION 'erasure refused: key % is the current identity key and this process does not hold it (it holds key %)',
                        current_key, array_to_string(keys, ', key ')
            USING ERRCODE = 'FBKEY',
                  HINT = 'run it with FENCEBRIDGE_IDENTITY_KEY set to the current key, and the '
                         'earlier keys bridges still run on in FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS; '
                         'nothing was erased';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(keys) AS k
                WHERE NOT EXISTS (SELECT 1 FROM identity_key i WHERE i.key_id = k)
                  AND k <> 1) THEN
        RAISE EXCEPTION 'an erasure''s identity keys must be recorded ones'
            USING ERRCODE = 'invalid_parameter_value';
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
                               rejected_deliveries, redrive_audits, tombstones, outbox_sent,
                               outbox_parked)
    VALUES (p_actor, p_reason, p_tenant_hash, p_operation_hash, 0, 0, 0, 0, 0, 0, 0)
    RETURNING id INTO erasure;

    -- A tombstone already there (an operation erased, written again by a release that ignored
    -- tombstones, and erased again) keeps its first record.
    WITH kept AS (
        INSERT INTO erased_operation (key_id, operation_hash, tenant_hash, payload_hash, state,
                                      outcome_code, erasure_id)
        SELECT k.key_id, p_operation_hashes[(o.i - 1) * cardinality(p_key_ids) + k.j],
               p_tenant_hash, w.payload_hash, w.state, w.outcome_code, erasure
          FROM work_item w
          JOIN unnest(p_operation_ids) WITH ORDINALITY AS o(operation_id, i)
            ON o.operation_id = w.operation_id
         CROSS JOIN unnest(p_key_ids) WITH ORDINALITY AS k(key_id, j)
         WHERE w.tenant_id = p_tenant_id
           AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)
            ON CONFLICT (key_id, operation_hash) DO NOTHING
        RETURNING erased_operation.key_id
    )
    SELECT count(*) FILTER (WHERE kept.key_id = current_key) INTO tombstones FROM kept;

    missed_keys := '{}';
    IF EXISTS (SELECT 1 FROM work_item w
                WHERE w.tenant_id = p_tenant_id
                  AND (p_operation_id IS NULL OR w.operation_id = p_operation_id)) THEN
        WITH marked AS (
            UPDATE identity_key k
               SET missed_erasure_at = now()
             WHERE k.key_id <> ALL (keys)
               AND k.missed_erasure_at IS NULL
            RETURNING k.key_id
        )
        SELECT coalesce(array_agg(marked.key_id ORDER BY marked.key_id), '{}')
          INTO missed_keys FROM marked;
    END IF;

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
    -- its outbox messages: sent ones, and parked ones where the caller asked. A pending one
    -- (a relay never touches another) is left, and refuses the erasure below: one made pending
    -- again while the erasure ran (a re-send of a parked one) is never dropped unsent.
    WITH gone AS (
        DELETE FROM outbox_message m
         WHERE m.tenant_id = p_tenant_id
           AND (p_operation_id IS NULL OR m.operation_id = p_operation_id)
           AND (m.state = 'sent' OR (m.state = 'parked' AND coalesce(p_drop_parked, false)))
        RETURNING m.state
    )
    SELECT count(*) FILTER (WHERE gone.state = 'sent'),
           count(*) FILTER (WHERE gone.state = 'parked')
      INTO outbox_sent, outbox_parked
      FROM gone;
    SELECT count(*) INTO pending
      FROM outbox_message m
     WHERE m.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR m.operation_id = p_operation_id);
    IF pending > 0 THEN
        RAISE EXCEPTION 'erasure refused: % outbox message(s) in scope were not sent yet when it ended', pending
            USING ERRCODE = 'object_in_use',
                  HINT = 'erase once the relay has sent them (an erasure would drop them unsent); '
                         'nothing was erased';
    END IF;
    -- what shadow subscriptions recorded of the scope (identifiers and hashes, no payload)
    DELETE FROM shadow_operation s
     WHERE s.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR s.operation_id = p_operation_id);
    DELETE FROM shadow_delivery d
     WHERE d.tenant_id = p_tenant_id
       AND (p_operation_id IS NULL OR d.operation_id = p_operation_id);

    UPDATE erasure_audit e
       SET work_rows = fencebridge_erase_under_keys.work_rows,
           payloads = fencebridge_erase_under_keys.payloads,
           rejected_deliveries = fencebridge_erase_under_keys.rejected_deliveries,
           redrive_audits = fencebridge_erase_under_keys.redrive_audits,
           tombstones = fencebridge_erase_under_keys.tombstones,
           outbox_sent = fencebridge_erase_under_keys.outbox_sent,
           outbox_parked = fencebridge_erase_under_keys.outbox_parked
     WHERE e.id = erasure;
    RETURN NEXT;
END
$$;

DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION fencebridge_erase_under_keys(text, text, text, text, '
                   'smallint[], text[], bytea[], text, text, boolean) SET search_path = %I, '
                   'pg_temp',
                   current_schema());
END
$pin$;

REVOKE ALL ON FUNCTION fencebridge_erase_under_keys(text, text, text, text, smallint[], text[],
                                                    bytea[], text, text, boolean) FROM PUBLIC;

-- The running release's erasure (0018's signature and result), now this one under its one key:
-- refused unless that key is the current one, marking the keys it misses, refused while an
-- outbox message in scope is unsent.
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
BEGIN
    IF p_key_id IS NULL THEN
        RAISE EXCEPTION 'an erasure needs a tenant id, its hash and the identity key id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT e.work_rows, e.payloads, e.rejected_deliveries, e.redrive_audits, e.tombstones
      FROM fencebridge_erase_under_keys(
               p_tenant_id, p_operation_id, p_tenant_hash, p_operation_hash, ARRAY[p_key_id],
               p_operation_ids, p_operation_hashes, p_actor, p_reason, false) AS e;
END
$$;

DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION fencebridge_erase(text, text, text, text, smallint, text[], '
                   'bytea[], text, text) SET search_path = %I, pg_temp', current_schema());
END
$pin$;

DROP FUNCTION fencebridge_erase_tenant(text, text, text, text);
