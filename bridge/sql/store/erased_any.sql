-- Whether any tombstone exists (migration 0014): an ingest that cannot hash keys (no identity
-- keys bound) must not write work while one might match.
SELECT EXISTS (SELECT 1 FROM erased_operation)
