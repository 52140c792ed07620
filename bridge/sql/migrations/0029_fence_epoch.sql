-- The fence's epoch (docs/target-classes.md, "Fences across a failover"): the server's timeline,
-- minus one, in the fence's upper 32 bits. Every claim issues greatest(fence, epoch) + 1. A
-- promotion starts a new timeline, so every fence issued after it is greater than every fence
-- issued before it, even one the promoted server never received (an asynchronous standby that
-- lagged). Timeline 1, a server never promoted, gives 0: fences count from 1 as they always did.
-- A server in recovery takes no claims; 0 there keeps its refusal the read-only one (25006)
-- rather than the WAL functions' error. pg_walfile_name names the segment of the current WAL
-- position under the timeline the server writes now (its first 8 hex digits).
CREATE FUNCTION fencebridge_fence_epoch() RETURNS bigint
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
        SELECT CASE WHEN pg_is_in_recovery() THEN 0::bigint
                    ELSE (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))
                          ::bit(32)::bigint - 1) << 32
               END
    $$;

-- The fence a claim issues after ``fence``: the next one, and never one below the epoch's first.
CREATE FUNCTION fencebridge_next_fence(fence bigint) RETURNS bigint
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT greatest(fence, fencebridge_fence_epoch()) + 1 $$;
