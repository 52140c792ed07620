-- A check a statement can fail on, for the inbox's one-round-trip write of a batch of new
-- operations (ingest_new_check.sql): that write sends BEGIN, the insert, the check and COMMIT
-- together, so the COMMIT must not run unless the batch was what it assumed (every key new, no
-- tombstone among them). A failed check fails its statement; the server then skips the COMMIT,
-- the transaction is rolled back whole, and the inbox writes the batch the careful way.
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
