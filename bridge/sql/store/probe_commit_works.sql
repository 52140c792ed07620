-- fencebridge check --probe, in its scratch schema only: inbox commits succeed again.
DROP TRIGGER probe_commit_fails ON work_item;
DROP TRIGGER probe_commit_fails ON payload;
DROP TRIGGER probe_commit_fails ON rejected_delivery;
DROP FUNCTION probe_commit_fails()
