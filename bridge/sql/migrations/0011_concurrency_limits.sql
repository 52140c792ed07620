-- Concurrency limits ([jobs.<name>] concurrency, concurrency_per_tenant): at most N rows of a job
-- type, or of a (job type, tenant), claimed at once, across every bridge process. The limits
-- live in the configuration, not here: each claim passes the limits of the job types it may
-- claim ({"<job_type>": [total or null, per tenant or null], ...}), and this function, called
-- from inside claim.sql and claim_keys.sql, says how much room each limited key has left.
--
-- Why a function: the room must be counted after the claimer holds the key's lock, on rows
-- committed by the claimer that held the lock before it. A statement's own snapshot is taken
-- when it starts, before any lock it then waits for; a VOLATILE function's queries each take a
-- fresh snapshot (READ COMMITTED, the bridge's isolation level), so the count below sees every
-- claim committed before the lock was granted. See claim.sql for the whole argument.
--
-- The locks are transaction-scoped advisory locks, one per limited job type (the two-key form,
-- apart from the single-key locks of the sweeper, purge and migrations), always taken all at
-- once and in one order (job type names, byte order): a transaction that holds some of them
-- never waits for another, so claimers cannot deadlock. A per-tenant limit shares its job
-- type's lock. A hash collision between two job types only makes their claims wait for each
-- other, never lets one pass a limit.
--
-- Rows returned: (job type, NULL, room) for a job-type-wide limit; (job type, '', limit) for the
-- room of a tenant with nothing claimed; (job type, tenant, room) for each tenant holding
-- claims. A slot is held by a row in state claimed, whether or not its lease has expired: a
-- run past its lease may still be acting, so its slot passes to the takeover of the same row
-- and is freed only when the row leaves claimed (settled, retried, released, parked).
--
-- A new function: nothing existing is touched. The running release does not call it and
-- claims without limits, as it always did.
CREATE FUNCTION fencebridge_concurrency_room(p_limits jsonb)
RETURNS TABLE (job_type text, tenant_id text, room bigint)
LANGUAGE plpgsql
VOLATILE
-- A few rows (one per limited job type, one per tenant holding claims): the estimate keeps the
-- claims' queue scans ordered and stopping at their LIMIT instead of hashing the whole queue.
ROWS 10
AS $$
#variable_conflict use_column
DECLARE
    limited text;
BEGIN
    FOR limited IN SELECT k FROM jsonb_object_keys(p_limits) AS k ORDER BY k COLLATE "C" LOOP
        PERFORM pg_advisory_xact_lock(731023, hashtext(limited));
    END LOOP;
    RETURN QUERY
    WITH l AS (
        SELECT e.key AS job_type, (e.value ->> 0)::bigint AS total,
               (e.value ->> 1)::bigint AS per_tenant
          FROM jsonb_each(p_limits) AS e
    ),
    held AS (
        SELECT w.job_type, w.tenant_id, count(*) AS n
          FROM work_item w
         WHERE w.state = 'claimed'
           AND w.job_type IN (SELECT l.job_type FROM l)
         GROUP BY w.job_type, w.tenant_id
    )
    SELECT l.job_type, NULL::text,
           l.total - coalesce((SELECT sum(h.n) FROM held h WHERE h.job_type = l.job_type), 0)::bigint
      FROM l
     WHERE l.total IS NOT NULL
    UNION ALL
    SELECT l.job_type, ''::text, l.per_tenant
      FROM l
     WHERE l.per_tenant IS NOT NULL
    UNION ALL
    SELECT h.job_type, h.tenant_id, l.per_tenant - h.n
      FROM held h
      JOIN l ON l.job_type = h.job_type
     WHERE l.per_tenant IS NOT NULL;
END
$$;
