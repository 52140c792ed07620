-- Drop an invalid index left by an interrupted concurrent build, without blocking writes.
-- {index} is the index's name, quoted as an identifier by the runner.
DROP INDEX CONCURRENTLY IF EXISTS {index}
