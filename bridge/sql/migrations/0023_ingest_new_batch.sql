-- The inbox's write of a batch of new operations as one statement: the insert, then, in the
-- same statement once every row is in, this check (ingest_insert_new.sql calls it). It fails
-- (SQLSTATE FBNEW, as 0022's check) unless the insert inserted every key of the batch (a key
-- that existed was left as it was) and none of them has a tombstone; the statement, its own
-- transaction, then commits nothing, and the inbox writes the batch the careful way.
--
-- VOLATILE (the default), so that its lookup of the tombstones takes a snapshot of its own,
-- after the insert's: an erasure that deleted a row while the insert waited on it has
-- committed by then, and its tombstone is seen here. A lookup in the insert's own statement
-- would read the snapshot taken before that wait, and write new work for an erased operation.
-- The tombstones are looked up by keyed hash (one entry per key and identity key held, as
-- ingest_erased.sql does); with no hashes to look them up by, any tombstone refuses the batch.
CREATE FUNCTION fencebridge_expect_new_batch(p_inserted bigint, p_expected bigint,
                                             p_key_id smallint[], p_operation_hash bytea[],
                                             p_any_erased boolean) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_inserted IS DISTINCT FROM p_expected
       OR EXISTS (SELECT 1
                    FROM unnest(p_key_id, p_operation_hash) AS c(key_id, operation_hash)
                    JOIN erased_operation e USING (key_id, operation_hash))
       OR (p_any_erased AND EXISTS (SELECT 1 FROM erased_operation)) THEN
        RAISE EXCEPTION 'fencebridge: expected every key of the batch new, and no tombstone'
            USING ERRCODE = 'FBNEW';
    END IF;
    RETURN true;
END
$$;
