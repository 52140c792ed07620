SELECT pg_advisory_unlock(7310231559371101);
