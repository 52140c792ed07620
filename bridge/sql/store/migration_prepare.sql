-- Serialise migrators (held until COMMIT) and make sure the record of applied migrations exists.
SELECT pg_advisory_xact_lock(7310231559371101);
