-- The room of the concurrency limits (0011's fencebridge_concurrency_room, which 0018's
-- fencebridge_claim_room calls under the limits' locks), counted from work_item_lease.
--
-- The function counts the claimed rows of the limited job types. It read them through
-- work_item_claimed, which 0020 dropped (a partial index the fenced writes' own state let the
-- planner take): without it, every limited claim read the whole table (20,000 settled rows
-- read per claim in the test). Claimed rows are exactly the rows with a lease (work_item's
-- CHECK); saying so lets the count read work_item_lease, the rows in flight. Same signature,
-- same rows, same locks: bridges of every release calling it keep their limits together.
CREATE OR REPLACE FUNCTION fencebridge_concurrency_room(p_limits jsonb)
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
           AND w.lease_expires_at IS NOT NULL  -- the same rows, read from work_item_lease
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
