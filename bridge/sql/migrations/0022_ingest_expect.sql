-- A check a statement can fail on, for the inbox's one-round-trip write of a batch of new
-- operations: the insert (ingest_insert_new.sql) and a check after it (ingest_new_check.sql:
-- every key new, no tombstone among them) go out in one pipeline, one implicit transaction,
-- which the Sync commits only if the check held. A failed check fails its statement; the
-- server rolls the transaction back whole, and the inbox writes the batch the careful way.
-- SQLSTATE FBNEW tells that refusal apart from any other error.
CREATE FUNCTION fencebridge_expect(p_ok boolean, p_what text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_ok IS NOT TRUE THEN
        RAISE EXCEPTION 'fencebridge: expected %', p_what USING ERRCODE = 'FBNEW';
    END IF;
    RETURN true;
END
$$;
