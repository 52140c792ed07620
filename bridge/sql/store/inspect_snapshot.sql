-- The first statement of an inspection: the row, its audit and its rejected deliveries are
-- read from one snapshot, and nothing can be written by mistake.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY
